# moetune. Variables given on make's command line (MODEL, STAGE, TRIAL, STUDY) reach the
# recipes as environment variables and are read quoted ("$$MODEL"), never pasted into shell text.
PY      := .venv/bin/python
MOETUNE := $(PY) -m moetune.cli.main
MODEL   ?= moe_proxy
export MODEL STAGE TRIAL STUDY FORCE

.PHONY: help install deps lint unit test tune demo stage report status plan clean

help:
	@echo "make demo                      tuning loop replaying the recorded GPU trial bank (no GPU)"
	@echo "make tune MODEL=qwen3_235b     tune an experiment (Slurm if sbatch is here, else local)"
	@echo "make status | make report     what the store holds; Markdown + HTML reports"
	@echo "make stage STAGE=analyze TRIAL=3 [FORCE=1]   re-run one stage of one trial"
	@echo "make plan MODEL=deepseek_v3    memory-feasible layouts"
	@echo "make lint                      ruff and mypy on the package"
	@echo "make unit                      the tests that need no service, two at a time (about 3 min)"
	@echo "make test                      lint, install everything and run the whole test suite"

install: .venv/.installed

.venv/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# System services and tools the tests use for real (root; Debian): Slurm + slurmdbd + MariaDB,
# Nsight Systems 2022.4, PostgreSQL, Chromium, and the Python 3.12 venv with megatron-core.
deps: install
	bash scripts/test-deps

# the tests that use real services (tests/conftest.py, pyproject's markers); the rest need none
SERVICES := slurm or nsys or megatron or postgres or chromium
PYTEST   := $(PY) -m pytest -q -ra -p no:cacheprovider

lint: install
	$(PY) -m ruff check moetune
	$(PY) -m mypy

# service-free, without the integration folder and the whole tuning studies: the quick tier
unit: install
	$(PYTEST) -n 2 -m "not ($(SERVICES) or integration or e2e)"

# service-free tests two at a time, then those using the real services one at a time (they share
# one Slurm cluster and one PostgreSQL)
test: lint deps
	$(PYTEST) -n 2 -m "not ($(SERVICES))"
	$(PYTEST) -m "$(SERVICES)"

tune: install
	$(MOETUNE) tune "$$MODEL"

demo: install
	$(MOETUNE) demo "$$MODEL"

stage: install
	@test -n "$$STAGE" -a -n "$$TRIAL" || { echo "usage: make stage STAGE=analyze TRIAL=N [FORCE=1]"; exit 2; }
	$(MOETUNE) stage "$$STAGE" --trial "$$TRIAL" $${FORCE:+--force}

report: install
	$(MOETUNE) report $${STUDY:+"$$STUDY"}

status: install
	$(MOETUNE) status $${STUDY:+"$$STUDY"}

plan: install
	$(MOETUNE) plan "$$MODEL"

clean:
	rm -rf .moetune runs reports
