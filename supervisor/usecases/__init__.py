"""What the supervisor does for a runner's request between its HTTP routes and the ledger:
the leases a claim or a result hands out (`grants`), the reports it observes before the ledger
judges them (`reports`) and the renewals it batches (`renewals`). Plain functions of the
supervisor's parts (`parts.Parts`), the caller and the records; nothing here knows HTTP."""
