"""Every read of fairq's state, and nothing that writes (docs/architecture.md).

- `jobs`      — the tenant choke-point: jobs an actor may see, one job or 404, tier grants.
- `lookups`   — the submit path's lookups (GPU types, tiers, the submitter's team).
- `reference` — GPU types, tiers and quotas as the pages and the API list them.
- `events`    — the job events the watchers read (long poll, event stream).
- `cluster`   — the cluster view as web processes read it (published by the worker).
- `capacity`  — capacity per GPU type and the GPUs jobs hold: one implementation each.
- `fairshare` — the fair-share settings, inputs and standings (now and in the past),
                their history from the snapshots, and a job's priority breakdown.
- `usage`     — usage per time bucket and the usage CSV export.
- `dashboard` — the web dashboard's lists, charts and quota board.
- `metrics`   — what /metrics and the scheduler health check read.
- `preemption` — what the policy knows of past preemptions: the rate limit (R5) and the
                nominated preemptors (R8).
- `snapshot`  — step 2 of the cycle: the policy's `Snapshot`, read once, for the cycle
                and for the queue plan.
- `queue_plan` — one cached admission plan of the whole queue: positions, "why it
                waits", the submit preview and a job's explanation.
"""
