-- kvbench results database, schema version 8 (DESIGN.md "Results", results/README.md).
--
-- `runs` holds the provenance of each sweep invocation; `units` one row per work unit, keyed by
-- the SHA-256 of its canonical fields (DESIGN.md "Work unit and its key"), with its progress and
-- outcome; a finished unit's results are `metrics` (one row per metric), `measurements` (one
-- row: tokens, times, memory; TASKS.md "Measurements every unit records") and `predictions`
-- (one row: the output text and the references). A bundle of units is written in one
-- transaction.
--
-- Conventions: times are ISO-8601 UTC text ('2025-01-31T12:00:00.000Z'); JSON columns hold
-- canonical JSON (sorted keys, no whitespace); sizes are bytes, durations milliseconds; a metric
-- that was NaN is stored as NULL (SQLite has no NaN).
--
-- This file is the source of truth. results/schema.cc embeds it verbatim (test_store checks that
-- the two are identical); `sqlite3 new.db < results/schema.sql` builds an empty database by hand.
-- Changing the layout means: bump user_version here, add a migration from the previous version
-- in results/schema.cc, and keep this file as the full schema of the new version.

CREATE TABLE runs (
  run_id          INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, even after deletions
  started_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  finished_at     TEXT,                                -- NULL while running and after a crash
  status          TEXT NOT NULL DEFAULT 'running'
                  CHECK (status IN ('running', 'ok', 'error', 'interrupted', 'crashed')),
  config_text     TEXT NOT NULL,                       -- the experiment YAML as given
  config_sha256   TEXT NOT NULL,                       -- SHA-256 of config_text
  git_rev         TEXT NOT NULL,                       -- the revision kvbench was built from
  kvbench_version TEXT NOT NULL,
  host            TEXT NOT NULL,                       -- the coordinator's (rank 0's) host
  ranks           INTEGER NOT NULL CHECK (ranks >= 1),
  devices         TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(devices)),  -- per rank: host, device
  model_hashes    TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(model_hashes)),  -- model -> sha256
  build_info      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(build_info)),  -- CUDA/NCCL/MPI
  -- Version 3: how the coordinator of a multi-rank run ended (results/README.md "Crashes"). NULL:
  -- not recorded (one process, or an older kvbench); 0: recorded, no signal seen, so a run left
  -- `running` died with its coordinator alone (its units in flight were bystanders); N > 0: the
  -- coordinator received signal N (mpirun stopping the job after a rank died: SIGCONT = 18 a
  -- second before its SIGTERM; or a user).
  end_signal      INTEGER CHECK (end_signal IS NULL OR end_signal >= 0)
);

-- One row per unit, never duplicated: registering a matrix again leaves existing rows alone.
-- The columns marked * are what the unit key hashes (with the result-schema version), except that
-- the key leaves out the file paths that task_options and policy_options show: their files enter
-- it by content (sample_sha256; a Python policy's script as "sha256:<hex>").
CREATE TABLE units (
  unit_key        TEXT NOT NULL PRIMARY KEY
                  CHECK (length(unit_key) = 64 AND unit_key NOT GLOB '*[^0-9a-f]*'),
  run_id          INTEGER NOT NULL REFERENCES runs (run_id),  -- registrar, then last attempt
  model           TEXT NOT NULL,                       -- the model's name in the config
  model_sha256    TEXT NOT NULL,                       -- * SHA-256 of the model file
  task            TEXT NOT NULL,                       -- *
  task_version    INTEGER NOT NULL,                    -- *
  task_options    TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(task_options)),  -- *
  sample_id       TEXT NOT NULL,                       -- *
  policy          TEXT NOT NULL,                       -- *
  policy_options  TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(policy_options)),  -- *
  kv_budget_spec  TEXT NOT NULL,                       -- * as configured: '256', '0.1 ratio', ''
  kv_budget       INTEGER,                             -- tokens; NULL until a ratio is resolved
  question        TEXT NOT NULL,                       -- * 'in_prompt' | 'after_compression'
  max_new_tokens  INTEGER NOT NULL,                    -- *
  seed            INTEGER NOT NULL,                    -- *
  generation      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(generation)),  -- * sampling settings
  -- Version 8: * SHA-256 of the unit's sample as the task built it (tasks::sample_sha256). NULL:
  -- registered by a kvbench before content keys (result schema 1, whose key held the task's file
  -- paths instead); the next sweep of its matrix adopts the row or supersedes it.
  sample_sha256   TEXT CHECK (sample_sha256 IS NULL OR
                              (length(sample_sha256) = 64 AND sample_sha256 NOT GLOB '*[^0-9a-f]*')),
  -- Version 8: the unit without its sample's content (results::UnitRow::slot_key): registering a
  -- unit of the same slot under another key (the sample's data was edited) supersedes this one.
  slot_key        TEXT CHECK (slot_key IS NULL OR
                              (length(slot_key) = 64 AND slot_key NOT GLOB '*[^0-9a-f]*')),
  -- The sample's grid coordinates (tasks::Sample::fields): all of them as JSON, the common ones
  -- also as typed columns for filtering and plotting.
  sample_fields   TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(sample_fields)),
  context_length  INTEGER,
  depth           REAL,
  -- Progress and outcome.
  -- superseded (version 8): its sample changed and a unit with the new content replaced it; its
  -- results stay but every query reads only 'ok' units.
  status          TEXT NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'running', 'ok', 'error', 'oom', 'timeout',
                                    'crashed', 'superseded')),
  attempts        INTEGER NOT NULL DEFAULT 0,          -- times it was handed to a worker
  crash_count     INTEGER NOT NULL DEFAULT 0,          -- runs that died while it was in flight
  error           TEXT,                                -- why: error, oom, timeout, crashed
  started_at      TEXT,                                -- of the last attempt
  finished_at     TEXT,
  rank            INTEGER,                             -- worker rank of the last attempt
  host            TEXT                                 -- worker host of the last attempt
);
CREATE INDEX units_by_task_policy_budget ON units (task, policy, kv_budget_spec, kv_budget);
CREATE INDEX units_by_status ON units (status);
CREATE INDEX units_by_run ON units (run_id);
CREATE INDEX units_by_slot ON units (slot_key);

-- The task's metrics for one unit (tasks::Task::score), one row each.
CREATE TABLE metrics (
  unit_key         TEXT NOT NULL REFERENCES units (unit_key) ON DELETE CASCADE,
  name             TEXT NOT NULL,
  value            REAL,                               -- NULL: the metric was NaN
  higher_is_better INTEGER NOT NULL CHECK (higher_is_better IN (0, 1)),
  PRIMARY KEY (unit_key, name)
) WITHOUT ROWID;
CREATE INDEX metrics_by_name ON metrics (name);

-- What running the unit cost (workers::UnitMeasurements, plus the device's peak). The columns
-- after unit_key are exactly common/measurement_fields.h, in its order (test_store checks it).
-- Known bad data: before the fix of issue 14, sweeps run under mpirun sent measurements to rank 0
-- without prefill_shared, so every row they wrote holds prefill_shared = 0 even where the
-- prefill was shared (one-process sweeps stored it correctly). Nothing in the database says
-- which process layout wrote a row (runs.ranks is the last attempt's run), so no migration can
-- repair it: rerun those units (`kvbench sweep --rerun`) where the column matters. Also before
-- that fix, ttft_ms of a unit with a shared prefill left the shared pass out (ttft_ms could be
-- below prefill_ms); the shared pass's own time was not stored, so that cannot be repaired either.
CREATE TABLE measurements (
  unit_key            TEXT NOT NULL PRIMARY KEY REFERENCES units (unit_key) ON DELETE CASCADE,
  prompt_tokens       INTEGER NOT NULL,
  generated_tokens    INTEGER NOT NULL,
  truncated_tokens    INTEGER NOT NULL,               -- removed by middle truncation
  prefill_ms          REAL NOT NULL,                  -- prompt forward, compression included
  ttft_ms             REAL NOT NULL,                  -- prefill + choosing the first token
  decode_ms           REAL NOT NULL,                  -- all decode steps
  decode_ms_p50       REAL NOT NULL,                  -- per decode step
  decode_ms_p99       REAL NOT NULL,
  tokens_per_s        REAL NOT NULL,                  -- generated tokens / decode time
  policy_ms           REAL NOT NULL,                  -- inside policy hooks
  kv_bytes_final      INTEGER NOT NULL,               -- logical: retained slots x slot bytes
  kv_bytes_peak       INTEGER NOT NULL,
  kv_physical_peak    INTEGER NOT NULL,               -- allocated
  policy_state_bytes  INTEGER NOT NULL,               -- at the end
  occupancy_mean      REAL NOT NULL,                  -- tokens per (layer, head), mean over steps
  occupancy_final     REAL NOT NULL,                  -- the same after the last step
  occupancy_peak      INTEGER NOT NULL,               -- the longest head at any step
  occupancy_min_final INTEGER NOT NULL,
  occupancy_max_final INTEGER NOT NULL,
  host_rss_peak       INTEGER NOT NULL,               -- VmHWM of the worker process
  device_peak_bytes   INTEGER,                        -- GPU allocator high-water mark; NULL on CPU
  -- Version 2: 1 when the prompt's forward pass was shared with the sample's other oneshot
  -- policies (prefill_ms is then that one shared pass). Last, as ALTER TABLE adds it.
  prefill_shared      INTEGER NOT NULL DEFAULT 0 CHECK (prefill_shared IN (0, 1)),
  -- Version 5: how many sequences the unit's decode steps ran with (mean over its steps; 1: it
  -- decoded alone, as every unit before version 5 did; 0: a writer that did not say). decode_ms,
  -- its percentiles and tokens_per_s are then those of the batch's steps: compare latency only
  -- at equal values.
  decode_batch        REAL NOT NULL DEFAULT 1 CHECK (decode_batch >= 0),
  -- Version 6: SHA-256 (lowercase hex) of the token ids the prompt fed the model, each an int32
  -- in little-endian order: after the chat template, BOS and truncation (generation and choice:
  -- the prompt before the first generated token or the choices; perplexity: the scored stream).
  -- Equal hashes show that two runs fed identical prompts. NULL: written before version 6.
  prompt_sha256       TEXT CHECK (prompt_sha256 IS NULL OR
                                  (length(prompt_sha256) = 64 AND prompt_sha256 NOT GLOB '*[^0-9a-f]*')),
  -- Version 7: prompt tokens whose forward pass came from an earlier prompt's prefill on the
  -- same worker (prefix reuse: the prompts began with the same tokens; results are the same
  -- bits, prefill_ms counts only the rest). 0: a prefill of its own (and every unit before 7).
  prefill_reused      INTEGER NOT NULL DEFAULT 0 CHECK (prefill_reused >= 0),
  -- Version 9: the bytes of the key channels ThinK zeroed in the final cache (policy think, or a
  -- policy's think: option), which kv_bytes_final and kv_bytes_peak leave out (a store that
  -- drops the channels would not hold them; kvbench zeroes them in place, so kv_physical_peak
  -- keeps them). 0: only tokens were evicted (every unit before 9).
  channel_bytes_pruned INTEGER NOT NULL DEFAULT 0 CHECK (channel_bytes_pruned >= 0)
);

-- The unit's output and its gold answers (JSON array of strings).
CREATE TABLE predictions (
  unit_key        TEXT NOT NULL PRIMARY KEY REFERENCES units (unit_key) ON DELETE CASCADE,
  prediction      TEXT NOT NULL,
  references_json TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(references_json))
);

-- Version 4: the SHA-256 of each model file the sweep hashed, keyed by what says the file is
-- unchanged, so that a resume or a second sweep does not read a 16 GB file again: a file whose
-- canonical path, size, modification time (ns) and inode all match its row takes the stored
-- digest; any difference hashes the file again and replaces the row. A file rewritten in place
-- within one mtime tick to the same size would keep a stale digest (no filesystem says more
-- without reading the file). Not part of any result: deleting rows only costs a re-hash.
CREATE TABLE file_digests (
  path       TEXT NOT NULL PRIMARY KEY,               -- canonical (symbolic links resolved)
  size       INTEGER NOT NULL CHECK (size >= 0),      -- bytes
  mtime_ns   INTEGER NOT NULL,                        -- st_mtim, nanoseconds since the epoch
  inode      INTEGER NOT NULL,                        -- st_ino (as a signed 64-bit integer)
  sha256     TEXT NOT NULL CHECK (length(sha256) = 64 AND sha256 NOT GLOB '*[^0-9a-f]*'),
  hashed_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) WITHOUT ROWID;

PRAGMA user_version = 9;
