"""Effect steps delivered by the supervisor itself (docs/design.md, Effects).

The ledger side (what an effect is, its outbox row, gates and uncertain effects) lives in
`tether.supervisor.ledger.outbox`; this package holds what sends effects: the credentials
folder, the registry of effect kinds, the deliverers and the dispatcher that runs them.
"""
