# ragplane task file: the README, CI and pre-commit all call these targets.
# `make help` lists them.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.DEFAULT_GOAL := help
.PHONY: help install install-gpu tools serve serve-cluster test test-ray test-all lint protos protos-check bench loadtest loadtest-fake soak fuzz crash flip-demo service-g2 service-g2-load clean

help: ## list targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-14s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml constraints.txt embedder_rs/Cargo.toml scripts/install.sh
	$(PYTHON) -m venv $(VENV)
	VENV=$(VENV) bash scripts/install.sh
	touch $@

install: $(VENV)/.installed ## create .venv with the service, embedder_rs and dev tools

# faiss-gpu-cu12 and onnxruntime-gpu install the same modules as faiss-cpu and onnxruntime:
# with both present the CPU files may win, so the twins go and the GPU wheels are laid again.
install-gpu: install ## also the [gpu] extra: faiss-gpu and onnxruntime-gpu (Linux x86_64 + CUDA)
	$(PIP) install -q -c constraints.txt -e ".[gpu]"
	if $(PY) -c "import platform, sys; sys.exit(not (sys.platform == 'linux' and platform.machine() == 'x86_64'))"; then \
	  $(PIP) uninstall -q -y faiss-cpu onnxruntime && \
	  $(PIP) install -q -c constraints.txt --force-reinstall --no-deps faiss-gpu-cu12 onnxruntime-gpu; \
	else echo "install-gpu: no GPU wheels for this platform; nothing changed"; fi
	$(PY) -c "import faiss, onnxruntime as o; print('faiss GPUs:', faiss.get_num_gpus() if hasattr(faiss, 'get_num_gpus') else 0, '| onnxruntime:', o.get_available_providers())"

tools: ## pinned Go tools into .tools/bin (grpcurl, protoc-gen-go, protoc-gen-go-grpc)
	bash scripts/install_tools.sh

serve: install ## install everything and serve gRPC on 127.0.0.1:50051 and OpenAI-style HTTP on :8080 (one process)
	$(VENV)/bin/ragplane serve --http-port $(or $(HTTP_PORT),8080)

serve-cluster: install ## a local PostgreSQL and three servers sharing it on 127.0.0.1:50051-50053 (Ctrl-C stops)
	$(PY) scripts/serve_cluster.py --servers $(or $(SERVERS),3)

protos: install tools ## regenerate ragplane/v1 and clients/go/ragplanev1 from protos/
	$(PY) scripts/gen_protos.py
	VENV=$(VENV) bash clients/go/generate.sh

protos-check: install tools ## fail if any generated code is stale
	$(PY) scripts/gen_protos.py --check
	VENV=$(VENV) bash clients/go/generate.sh --check

lint: install ## ruff, import-linter's layers, the size limits (generated code excluded), mypy (strict) on the store and its protocol's coverage
	$(VENV)/bin/ruff check ragplane tests bench loadtest scripts clients/python
	$(VENV)/bin/lint-imports
	$(PY) scripts/check_sizes.py
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/index/test_backend.py

test: install tools protos-check lint ## install everything and run every test (Python, Rust, Go)
	RUN_CLIENTS=1 VENV=$(VENV) bash scripts/run_tests.sh

test-ray: install ## only the tests on a local Ray cluster (ingest, kill and re-run, rebuild); in `make test` too
	SKIP_CARGO_TEST=1 VENV=$(VENV) bash scripts/run_tests.sh -m ray

test-all: install tools ## also the slow tests
	VENV=$(VENV) bash scripts/run_tests.sh -m "not gpu"
	VENV=$(VENV) bash scripts/test_clients.sh

.PHONY: test-neon
test-neon: ## embedder_rs's NEON tile and host pass, cross-built for aarch64, under qemu-user (scripts/test_neon.sh)
	bash scripts/test_neon.sh

bench: install ## side-by-side benchmarks; writes BENCHMARKS.md
	$(PY) -m bench

loadtest: install ## a 30 s mixed Locust run against a server it starts, with the real model
	$(PY) -m loadtest --scenario mixed --users 16 --spawn-rate 8 --run-time 30s --start-server

loadtest-fake: install ## the same with the fake embedder: the server alone, without the model
	$(PY) -m loadtest --scenario mixed --users 16 --spawn-rate 8 --run-time 30s --start-server --fake-embedder

soak: install ## 10 min Locust mixed, real model, shadow on: RSS/fds/threads/p99 every 30 s (BENCHMARKS.md 9)
	$(PY) -m bench.soak --write

fuzz: install ## the descriptor fuzzer at scale: >= 100,000 cases over every RPC, no INTERNAL, alive after each
	RAGPLANE_FUZZ_PER_RPC=$(or $(FUZZ_PER_RPC),4200) RAGPLANE_FUZZ_MIN_CASES=$(if $(FUZZ_PER_RPC),500,100000) \
	  $(PY) -m pytest tests/reliability/test_fuzz.py -q -s -p no:cacheprovider --timeout=0

crash: install ## 100 kill -9 cycles of each crash test, every acknowledged write checked after each
	RAGPLANE_CRASH_KILLS=$(or $(CRASH_KILLS),100) $(PY) -m pytest tests/reliability/test_crash.py tests/reliability/test_crash_lexical.py -q -s -p no:cacheprovider --timeout=0

flip-demo: install ## the embeddings case flipping on its own evidence, or the gate that holds it (exit 3)
	$(PY) -m bench.flip

service-g2: install ## G2 in the service: Locust mixed, shadow at sample rate 1.0, ~4 minutes
	$(PY) -m bench.service_g2

service-g2-load: install ## G2 from a quiet run (1 user) and a loaded one (8 users) side by side, 2 min each
	$(PY) -m bench.service_g2 --quiet-and-loaded --run-time 120

clean: ## remove the venv and build outputs
	rm -rf $(VENV) .tools embedder_rs/target clients/rust/target ragplane-data ragplane-cluster
