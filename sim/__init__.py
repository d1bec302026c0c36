"""The schedule explorer: a deterministic simulation that drives the real ledger rules.

`harness` runs the ledger's rules on a scratch file with a virtual clock; `actors` are the
simulated operator, runners and messages; `repos` models the repositories, the runners' work and
the evidence the supervisor's adapters observe; `dispatch` plays the supervisor's effect
dispatcher step by step through the outbox rules, and `receivers` models where effects land;
`observer` checks the ledger from outside after every event; `world` joins them into primitives
(deliver, crash, pause, reap, poll, ...); `hazards` plays the adversarial histories and
`scenarios` sets each one up by hand; `schedule` drives one seeded schedule, `seeds` names them,
`snapshot` prints a violation report, and `explore` is `tether-supervisor chaos explore`.
"""
