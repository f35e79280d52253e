# Herald: two commands on a fresh machine with Python 3.11, pip and make.
#   make run    install into .venv and start the whole platform (Ctrl-C stops all of it)
#   make test   install into .venv and run the whole test suite
# Everything is installed from requirements.lock (exact versions) into a local virtualenv:
# no root, no Docker, nothing pre-started.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test test-fast bench lint lock clean help

help:
	@echo "make run     start the whole platform on embedded defaults (Ctrl-C stops it)"
	@echo "make test    run the whole test suite against real embedded services"
	@echo "make test-fast  unit and single-process tests only (no embedded services)"
	@echo "make bench   run every benchmark and write bench/results/REPORT.md with PNG plots"
	@echo "make lint    ruff and mypy"
	@echo "make lock    re-pin requirements.lock from pyproject.toml"

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] in ((3, 11), (3, 12)), "Herald needs Python 3.11 or 3.12 (Bytewax 0.21.1)"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# uv (from PyPI, into the venv) installs the same pinned set in ~12 s where pip takes ~60 s;
	@# pip does it if uv cannot (it reads only PyPI, not pip's own configured indexes).
	@# Bytecode is compiled here, once (~14 s): otherwise each of the dozens of processes of
	@# `make run` or `make test` compiles the same modules, at every start where
	@# PYTHONDONTWRITEBYTECODE is set (herald up: 38.5 s and 61 CPU-s -> 25.3 s and 29; lane 1
	@# of the tests: 236 s and 422 CPU-s -> 176 s and 282)
	$(BIN)/python -m pip install --quiet uv && $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -r requirements.lock \
		|| $(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	$(BIN)/python -m compileall -q -j 0 herald dataflows schemas sinks sources api dashboards infra bench >/dev/null
	@touch $(STAMP)

run: install
	$(BIN)/herald up

# three lanes (tests/conftest.py marks them; README "Tests" has the figures):
#  1. everything but the whole stacks, on six pytest-xdist workers (by module, slowest modules
#     first: they mostly wait on the processes they start; lane 1 alone took 217 s on four
#     workers, 176 s on six and 170 s on eight, which cost 9 % more CPU than six), alone;
#  2. then the tests that start a whole stack of their own (fault injection; two processes per
#     job running the demo), one at a time, output in .herald/test-own-stacks.log;
#  3. beside lane 2, the end-to-end package on its shared stack. Lane 2 waits until that stack
#     is up with its users (.herald/e2e-stack-ready, or lane 3 ended): lane 3, the longer lane,
#     took 49-53 s to get there while lane 2 started its first stack, 29 s alone.
#     Lanes 1 and 2 each keep the machine busy, lane 3 mostly waits on the stack's timers: side
#     by side, lane 1 took twice as long as alone, while lane 3 alone used a third of the cores.
#     All three at once took 550-900 s and failed six of eight fresh-clone runs.
# Lane 2 is printed at the end. Ctrl-C stops every lane (tests/conftest.py `pytest_configure`:
# a background job starts with SIGINT ignored; a lane 2 still waiting is killed); after a
# stopped lane 1 no other lane starts.
test: install
	@mkdir -p .herald; \
	$(BIN)/python -m pytest -m "not whole_stack" -n 6 --dist loadfile --no-loadscope-reorder; \
	parallel=$$?; \
	if [ $$parallel -eq 2 ]; then \
		echo "make test: lane 1 was stopped (Ctrl-C or a collection error): no other lane"; \
		exit 2; \
	fi; \
	ready=.herald/e2e-stack-ready; rm -f $$ready; \
	{ for i in $$(seq 1200); do [ -e $$ready ] && break; sleep 0.5; done; \
	  $(BIN)/python -m pytest -m whole_stack --ignore=tests/e2e -p no:xdist \
		--basetemp=.herald/pytest-own-stacks; } >.herald/test-own-stacks.log 2>&1 & own=$$!; \
	HERALD_TEST_E2E_READY_FILE=$$ready $(BIN)/python -m pytest tests/e2e -p no:xdist \
		--basetemp=.herald/pytest-e2e; shared=$$?; \
	if [ $$shared -eq 2 ] && [ ! -e $$ready ]; then kill $$own 2>/dev/null; fi; touch $$ready; \
	wait $$own; stacks=$$?; \
	echo "== the whole-stack tests with stacks of their own (ran beside the end-to-end lane)"; \
	cat .herald/test-own-stacks.log; \
	echo "make test: lane exits: parallel $$parallel, own stacks $$stacks, shared stack $$shared"; \
	test $$parallel -eq 0 -a $$stacks -eq 0 -a $$shared -eq 0

# unit and single-process tests: no embedded services, no stack (tests/conftest.py marks the rest)
test-fast: install
	$(BIN)/python -m pytest -m "not integration" -q

# every SPEC §6 benchmark → bench/results/REPORT.md + PNGs (~15 min); e.g. BENCH_ARGS="plan --quick"
bench: install
	$(BIN)/python -m bench $(BENCH_ARGS)

lint: install
	$(BIN)/python -m ruff check . && $(BIN)/python -m mypy herald infra schemas sources sinks dataflows api

lock:
	rm -rf /tmp/herald-lock-venv && $(PYTHON) -m venv /tmp/herald-lock-venv
	/tmp/herald-lock-venv/bin/python -m pip install --quiet --upgrade pip
	/tmp/herald-lock-venv/bin/python -m pip install --quiet ".[embedded,test,bench]"
	{ echo "# Exact versions of every dependency (direct and transitive) for Python 3.11 on Linux."; \
	  echo "# Regenerate with \`make lock\` after changing pyproject.toml."; \
	  /tmp/herald-lock-venv/bin/python -m pip freeze --exclude-editable | grep -v '^herald'; } > requirements.lock

clean:
	rm -rf $(VENV) .herald .pytest_cache
