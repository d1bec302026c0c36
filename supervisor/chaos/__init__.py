"""The schedule explorer: a deterministic simulation that drives the real ledger rules.

`harness` runs the ledger's own rules on a scratch SQLite file with a virtual clock; `actors`
are the simulated runners, operator and network; `observer` keeps the explorer's own record of
what it saw and checks every invariant after every event; `world` joins them; `hazards` holds
the adversarial histories; `schedule` draws a seeded fault plan and drives one schedule;
`explore` is the command line (`tether-supervisor chaos explore`).
"""
