"""The schedule explorer: a deterministic simulation that drives the real ledger rules.

`harness` runs the ledger's own rules on a scratch SQLite file with a virtual clock; `actors`
are the simulated operator, runners and network messages; `observer` keeps the explorer's own
record of what it saw and checks it after every event, beside `find_violations`; `world` joins
them into primitives (deliver, crash, pause, reap, poll, ...); `hazards` plays the adversarial
histories and `scenarios` sets each one up by hand; `schedule` draws a seeded fault plan,
drives one schedule and then quiescence; `seeds` names schedules; `snapshot` prints the ledger
for a violation report; `explore` is `tether-supervisor chaos explore`.
"""
