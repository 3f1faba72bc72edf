"""The store's schema (SQLAlchemy Core). To change it, add its Alembic revision under
gpulayer/control/migrations/versions, named ``00NN_what.py`` for the next schema number NN:
the newest revision's number is the schema version (see schema.HEAD), kept nowhere else. A
revision names the columns it changes itself, never these tables, and changes only what is
missing, as the others do."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

meta = Table(
    "meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(63), nullable=False),
    Column("spec", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reason", String(32)),
    Column("message", Text),
    Column("exit_code", Integer),
    Column("result", Text),
    Column("target", String(16), nullable=False),
    Column("working_dir", Text),
    Column("has_bundle", Boolean, nullable=False, default=False),
    # Added in schema 10: the kept bundle (bundles/<digest>.tar.gz) the job runs; a job of an
    # older schema has its bundle as a file in its folder instead, named by bundle.sha256.
    Column("bundle_digest", String(64)),
    Column("attempts", Integer, nullable=False, default=0),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("labels", Text, nullable=False, default="{}"),
)
Index("ix_jobs_state_created", jobs.c.state, jobs.c.created_at)
Index("ix_jobs_created", jobs.c.created_at)
# Added in schema 5: covers the dashboard's page order, so a deep page skips rows in the index.
Index("ix_jobs_created_id", jobs.c.created_at, jobs.c.id)
# Added in schema 10: whether any job still runs a kept bundle, asked when one is deleted.
Index("ix_jobs_bundle_digest", jobs.c.bundle_digest)

workers = Table(
    "workers",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(128), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("labels", Text, nullable=False, default="{}"),
    Column("capabilities", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("registered_at", Float, nullable=False),
    Column("last_heartbeat", Float, nullable=False),
    Column("epoch", Integer, nullable=False, default=1),
)

attempts = Table(
    "attempts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(32), ForeignKey("jobs.id"), nullable=False),
    Column("number", Integer, nullable=False),
    Column("worker_id", String(32), ForeignKey("workers.id")),
    Column("gpu_indices", Text, nullable=False, default="[]"),
    Column("state", String(16), nullable=False),
    Column("reason", String(32)),
    Column("exit_code", Integer),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    # Added in schema 4: the worker's epoch when the attempt was assigned (fencing).
    Column("worker_epoch", Integer),
    # Added in schema 6: a gang's node (one attempt per node, all with one number), and the
    # return value of a node that ran torch rank 0, kept until the whole gang has ended.
    Column("node_rank", Integer, nullable=False, default=0),
    Column("result", Text),
)
Index("ix_attempts_job", attempts.c.job_id, attempts.c.number, attempts.c.node_rank, unique=True)
Index("ix_attempts_worker_state", attempts.c.worker_id, attempts.c.state)

logs = Table(
    "logs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(32), ForeignKey("jobs.id"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("stream", String(8), nullable=False),
    Column("text", Text, nullable=False),
    Column("at", Float, nullable=False),
    # Added in schema 6: the gang node that wrote the line; None for one node and for the
    # control plane's own notes.
    Column("node", Integer),
)
Index("ix_logs_job_id", logs.c.job_id, logs.c.id)

artifacts = Table(
    "artifacts",
    metadata,
    Column("job_id", String(32), ForeignKey("jobs.id"), primary_key=True),
    Column("path", Text, primary_key=True),
    Column("size", Integer, nullable=False),
    Column("sha256", String(64), nullable=False),
)

# Added in schema 2: API tokens, kept as hashes (never the token itself). Schema 4 gives each a
# public id, a kind of admin, join (registers workers) or worker (one worker's own credential),
# scrypt digests for chosen tokens (hash is then "scrypt:<id>"), expiry, a cap on the workers a
# join token may register, and revocation.
tokens = Table(
    "tokens",
    metadata,
    Column("hash", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("name", String(128), nullable=False, default=""),
    Column("created_at", Float, nullable=False),
    Column("id", String(16)),
    Column("scheme", String(8), nullable=False, default="sha256"),
    Column("salt", String(64)),
    Column("digest", String(128)),
    Column("worker_id", String(32)),
    Column("parent_id", String(16)),
    Column("expires_at", Float),
    Column("max_workers", Integer),
    Column("registered", Integer, nullable=False, default=0),
    Column("revoked_at", Float),
)
Index("ix_tokens_id", tokens.c.id, unique=True)
Index("ix_tokens_worker", tokens.c.worker_id)

# Added in schema 3: every cloud instance a job rents, written before the call that creates it,
# and its cost ledger (launch, ready and end times with the hourly price).
instances = Table(
    "instances",
    metadata,
    Column("request_id", String(64), primary_key=True),
    # NULL (schema 14): a fleet's machine no job has taken yet.
    Column("job_id", String(32), ForeignKey("jobs.id"), nullable=True),
    Column("owner", String(64), nullable=False),
    Column("provider", String(64), nullable=False),
    Column("region", String(64)),
    Column("zone", String(64)),
    Column("instance_type", String(128)),
    Column("instance_id", String(128)),
    Column("state", String(16), nullable=False),
    Column("ssh_host", String(255)),
    Column("key_path", Text),
    Column("hourly_price", Float),
    Column("currency", String(3), nullable=False, default="USD"),
    Column("spot", Boolean, nullable=False, default=False),
    Column("tags", Text, nullable=False, default="{}"),
    Column("created_at", Float, nullable=False),
    Column("launched_at", Float),
    Column("ready_at", Float),
    Column("ended_at", Float),
    Column("note", Text),
    # Added in schema 5 (the lifecycle reconciler): what it needs to resume after a restart.
    Column("offer", Text),
    Column("state_since", Float),
    Column("tunnel_port", Integer),
    Column("token_hash", String(64)),
    Column("install_dir", Text),
    Column("machine", Text),
    # Added in schema 8 (cloud gangs): the instances launched together for one job share a
    # launch id (node 0's request id); each has its node rank. None / 0 for a lone instance.
    Column("launch_id", String(64)),
    Column("node_rank", Integer, nullable=False, default=0),
    # Added in schema 9: what a try ended in, as typed columns the next choice reads (never
    # parsed back from the note), and what the reconciler must not forget on a restart.
    Column("outcome", String(16)),
    Column("outcome_scope", String(16)),
    Column("outcome_message", Text),
    Column("hold_until", Float),
    Column("last_error", Text),
    Column("step_failures", Integer, nullable=False, default=0),
    Column("next_step_at", Float),
    Column("unreachable_since", Float),
    # Added in schema 12: the lifecycle's other timers, so a restart or a second controller
    # sees them: when its running job was last checked, and when a reclaim was first seen
    # while its job still saved its work.
    Column("checked_at", Float),
    Column("reclaimed_at", Float),
    # Added in schema 13: what the instance's last lifecycle step found (a StepResult as
    # JSON: its outcome, the exception's kind and message, the move it made, a not_before),
    # and since when a restarted controller is to reopen its worker's tunnel.
    Column("last_step", String(16)),
    Column("last_step_result", Text),
    Column("step_at", Float),
    Column("relink_since", Float),
    # Added in schema 14: the named fleet (providers.yaml's fleets:) the machine belongs to.
    Column("fleet", String(64)),
)
Index("ix_instances_state", instances.c.state)
Index("ix_instances_hold", instances.c.hold_until)
Index("ix_instances_job", instances.c.job_id)

# Schedules (new tables, so create_all adds them to an existing store): each schedule with its
# watermark (ticks at or before it are decided), and one row per decided tick. The UNIQUE
# (schedule_id, tick) row is written in the same transaction as the job it creates, which is
# what makes a tick fire once across restarts and server processes.
schedules = Table(
    "schedules",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(63), nullable=False, unique=True),
    Column("spec", Text, nullable=False),
    Column("suspend", Boolean, nullable=False, default=False),
    Column("working_dir", Text),
    Column("has_bundle", Boolean, nullable=False, default=False),
    Column("watermark", Float, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

schedule_runs = Table(
    "schedule_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("schedule_id", String(32), ForeignKey("schedules.id"), nullable=False),
    Column("tick", Float, nullable=False),
    Column("manual", Boolean, nullable=False, default=False),
    Column("outcome", String(24), nullable=False),
    Column("job_id", String(32)),
    Column("message", Text),
    Column("created_at", Float, nullable=False),
)
Index("ux_schedule_runs_tick", schedule_runs.c.schedule_id, schedule_runs.c.tick, unique=True)
Index("ix_schedule_runs_job", schedule_runs.c.job_id)

# The source a schedule's jobs run, snapshotted at apply: in the store rather than one server's
# disk, so whichever server fires a tick can hand it to the job.
schedule_sources = Table(
    "schedule_sources",
    metadata,
    Column("schedule_id", String(32), ForeignKey("schedules.id"), primary_key=True),
    Column("bundle", LargeBinary, nullable=False),
)

# Bytes of output the store holds per job, and how many were cut to stay under the log cap.
log_usage = Table(
    "log_usage",
    metadata,
    Column("job_id", String(32), ForeignKey("jobs.id"), primary_key=True),
    Column("bytes", BigInteger, nullable=False, default=0),
    Column("cut_bytes", BigInteger, nullable=False, default=0),
)

# Added in schema 5: every move of an instance between lifecycle states, with its reason.
instance_transitions = Table(
    "instance_transitions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("request_id", String(64), ForeignKey("instances.request_id"), nullable=False),
    Column("from_state", String(16)),
    Column("to_state", String(16), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("at", Float, nullable=False),
)
Index(
    "ix_instance_transitions_request", instance_transitions.c.request_id, instance_transitions.c.id
)

# Added in schema 5: which instance (and, once it joined, which worker) a job runs on. The
# job's own spec is never edited for this.
reservations = Table(
    "reservations",
    metadata,
    Column("request_id", String(64), ForeignKey("instances.request_id"), primary_key=True),
    Column("job_id", String(32), ForeignKey("jobs.id"), nullable=True),
    Column("worker_id", String(32)),
    Column("state", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("bound_at", Float),
    Column("released_at", Float),
)
Index("ix_reservations_job", reservations.c.job_id, reservations.c.state)
Index("ix_reservations_worker", reservations.c.worker_id)

# The web dashboard's sessions, by the SHA-256 of the cookie (never the cookie itself), each
# with its CSRF token and expiry; and one-time login links, used at most once.
ui_sessions = Table(
    "ui_sessions",
    metadata,
    Column("id_hash", String(64), primary_key=True),
    Column("csrf", String(64), nullable=False),
    Column("token_id", String(16)),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("ended_at", Float),
)

ui_login_links = Table(
    "ui_login_links",
    metadata,
    Column("code_hash", String(64), primary_key=True),
    Column("token_id", String(16)),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("used_at", Float),
)

# Added in schema 11: what a create (POST /v1/jobs, /v1/tokens, a schedule's trigger) answered,
# by the caller and the Idempotency-Key it sent, so a request sent again is answered with the
# first one's records rather than making new ones. The primary key is what makes two
# concurrent duplicates create once: the second one's transaction fails whole.
idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("caller", String(64), primary_key=True),
    Column("key", String(255), primary_key=True),
    Column("fingerprint", String(64), nullable=False),
    Column("answer", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)
Index("ix_idempotency_keys_created", idempotency_keys.c.created_at)

# Added in schema 12: the lifecycle's steps in flight, one row per step key (an instance's
# launch, its provisioning or check, its teardown; a job's plan; the reaper) while a controller
# runs it. A lease ends when its step does, or at lock_expires_at when its controller stopped
# renewing it (it died): until then no controller starts that step again.
lifecycle_leases = Table(
    "lifecycle_leases",
    metadata,
    Column("key", String(128), primary_key=True),
    Column("lock_token", String(32), nullable=False),
    Column("lock_expires_at", Float, nullable=False),
)

# Added in schema 12: a job that waits for capacity is planned again no sooner than this.
capacity_waits = Table(
    "capacity_waits",
    metadata,
    Column("job_id", String(32), primary_key=True),
    Column("not_before", Float, nullable=False),
)

# Added in schema 15: the team server's secret store. A value is kept only encrypted, with a key
# held in a file beside the database (never in it); ``scope`` says whose secret it is ("server"
# for the server's own: every job of it may name it).
secrets = Table(
    "secrets",
    metadata,
    Column("scope", String(64), primary_key=True),
    Column("name", String(128), primary_key=True),
    Column("ciphertext", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)
