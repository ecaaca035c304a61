-- A moetune store of schema version 1, frozen (made by pipeline/store.py at schema v1).
-- tests/test_store.py opens it with today's Store: never regenerate it, add a newer one.
BEGIN TRANSACTION;
CREATE TABLE decisions (
	id INTEGER NOT NULL, 
	study_id INTEGER NOT NULL, 
	trial_id INTEGER, 
	kind VARCHAR(32) NOT NULL, 
	rule VARCHAR(100), 
	reason TEXT NOT NULL, 
	evidence JSON NOT NULL, 
	created_at VARCHAR(32) NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(study_id) REFERENCES studies (id), 
	FOREIGN KEY(trial_id) REFERENCES trials (id)
);
INSERT INTO "decisions" VALUES(1,1,2,'apply','lower_ep_within_nvlink','exposed all-to-all 31% of the step','{"exposed_a2a_share": 0.31}','2026-11-23T00:45:59+00:00');
CREATE TABLE metrics (
	id INTEGER NOT NULL, 
	trial_id INTEGER NOT NULL, 
	name VARCHAR(100) NOT NULL, 
	rank INTEGER, 
	value FLOAT NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(trial_id) REFERENCES trials (id)
);
INSERT INTO "metrics" VALUES(1,1,'exposed_a2a_share',NULL,0.31);
INSERT INTO "metrics" VALUES(2,1,'gpu_idle_share',NULL,0.12);
CREATE TABLE moetune_meta (
	"key" VARCHAR(64) NOT NULL, 
	value TEXT NOT NULL, 
	PRIMARY KEY ("key")
);
INSERT INTO "moetune_meta" VALUES('schema_version','1');
CREATE TABLE stage_runs (
	id INTEGER NOT NULL, 
	trial_id INTEGER NOT NULL, 
	stage VARCHAR(32) NOT NULL, 
	inputs_hash VARCHAR(64) NOT NULL, 
	outputs JSON NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	error TEXT, 
	started_at VARCHAR(32) NOT NULL, 
	ended_at VARCHAR(32), 
	PRIMARY KEY (id), 
	FOREIGN KEY(trial_id) REFERENCES trials (id)
);
INSERT INTO "stage_runs" VALUES(1,1,'analyze','feedbeef','["analysis.json"]','ok',NULL,'2026-11-23T00:45:59+00:00','2026-11-23T00:45:59+00:00');
CREATE TABLE studies (
	id INTEGER NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	model VARCHAR(200) NOT NULL, 
	experiment JSON NOT NULL, 
	state VARCHAR(32) NOT NULL, 
	created_at VARCHAR(32) NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (name)
);
INSERT INTO "studies" VALUES(1,'qwen3_30b_a3b-h100','qwen3_30b_a3b','{"tuning": {"budget_trials": 8}}','running','2026-11-23T00:45:59+00:00');
CREATE TABLE trials (
	id INTEGER NOT NULL, 
	study_id INTEGER NOT NULL, 
	number INTEGER NOT NULL, 
	config JSON NOT NULL, 
	config_hash VARCHAR(64) NOT NULL, 
	parent_id INTEGER, 
	fix VARCHAR(100), 
	state VARCHAR(32) NOT NULL, 
	slurm_job_id VARCHAR(64), 
	folder TEXT, 
	submitted_at VARCHAR(32), 
	started_at VARCHAR(32), 
	ended_at VARCHAR(32), 
	step_time_ms FLOAT, 
	step_time_std_ms FLOAT, 
	tflops_per_gpu FLOAT, 
	peak_memory_gb FLOAT, 
	wall VARCHAR(32), 
	created_at VARCHAR(32) NOT NULL, 
	PRIMARY KEY (id), 
	UNIQUE (study_id, config_hash), 
	UNIQUE (study_id, number), 
	FOREIGN KEY(study_id) REFERENCES studies (id), 
	FOREIGN KEY(parent_id) REFERENCES trials (id)
);
INSERT INTO "trials" VALUES(1,1,1,'{"tp": 1, "ep": 16}','a1b2c3d4e5f60718',NULL,NULL,'completed','4242',NULL,NULL,NULL,NULL,1234.5,NULL,NULL,61.2,'communication','2026-11-23T00:45:59+00:00');
INSERT INTO "trials" VALUES(2,1,2,'{"tp": 1, "ep": 8}','0f1e2d3c4b5a6978',1,'lower_ep_within_nvlink','pending',NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,'2026-11-23T00:45:59+00:00');
COMMIT;
