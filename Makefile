# kvrouter: run `make help` for the targets.
GO       ?= go
BIN      ?= bin
FUZZTIME ?= 20s

.DEFAULT_GOAL := help

# Where `make models` puts the tokenizer files (scripts/fetch-models.sh reads the same
# variable) and where demo and faults take them from.
MODELS   ?= $(or $(KVROUTER_MODELS_DIR),.cache/models)

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build every command into ./bin.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/... ./testbench/cmd/...

.PHONY: demo
demo: models ## Run kvrouter on a local simulated fleet behind a gateway; compare round-robin, kv and placement.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/kvrouter ./testbench/cmd/vllm-sim ./testbench/cmd/devgateway ./testbench/cmd/kvdemo
	$(BIN)/kvdemo --bin $(BIN) --tokenizer $(MODELS)/qwen3

.PHONY: faults
faults: models ## Run the fault suite on a local stack, then the replica faults (about 3 minutes); write docs/data/faults.json, docs/data/replicas/faults.json and render docs/faults.md.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/kvrouter ./testbench/cmd/vllm-sim ./testbench/cmd/devgateway ./testbench/cmd/kvdemo
	$(BIN)/kvdemo faults --bin $(BIN) --tokenizer $(MODELS)/qwen3 --json docs/data/faults.json
	$(BIN)/kvdemo faults --replicas --bin $(BIN) --tokenizer $(MODELS)/qwen3 --json docs/data/replicas/faults.json
	python3 scripts/docs.py

.PHONY: models
models: ## Fetch the tokenizer files the tests use into .cache/models, or $KVROUTER_MODELS_DIR (sha256-verified).
	KVROUTER_MODELS_DIR=$(MODELS) bash scripts/fetch-models.sh

.PHONY: test
test: models ## Run all tests with the race detector, then without it the full tokenizer golden proof, the parse-cost and the peak-RSS tests.
	HELM=$(HELM) $(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run '^TestGolden$$' ./tokenizer/
	$(GO) test -count=1 -run '^TestParseCostCoversPromptAllocations$$' ./extproc/
	$(GO) test -count=1 -run '^TestPeakRSSUnderHugeBodies$$' ./internal/app/

.PHONY: bench
bench: ## Run the benchmarks (one core, 5 runs each; compare with benchstat).
	$(GO) test -run '^$$' -bench . -benchmem -count 5 -cpu 1 ./...

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each.
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

.PHONY: docs
docs: ## Render every table in docs/ from the JSON committed beside it (scripts/docs.py).
	python3 scripts/docs.py

.PHONY: docs-data
docs-data: models ## Rerun the kvbench sim runs whose JSON docs/results-policy.md renders (minutes).
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./testbench/cmd/kvbench
	KVROUTER_MODELS_DIR=$(MODELS) KVBENCH=$(BIN)/kvbench sh scripts/policy-variants.sh docs/policy
	python3 scripts/docs.py

.PHONY: workloads-data
workloads-data: models ## Rerun the kvbench sim runs whose JSON docs/results-workloads.md renders (minutes).
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./testbench/cmd/kvbench
	KVROUTER_MODELS_DIR=$(MODELS) KVBENCH=$(BIN)/kvbench sh scripts/workload-data.sh docs/data/workloads
	python3 scripts/docs.py

.PHONY: docs-check
docs-check: ## Fail when a table in docs/ differs from what its committed JSON renders.
	python3 scripts/docs.py --check

.PHONY: lint
lint: ## gofmt, go vet and staticcheck (its default checks; `make tools` builds it).
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet ./...
	@command -v $(STATICCHECK) >/dev/null || { echo "lint: no staticcheck at $(STATICCHECK): run make tools"; exit 1; }
	$(STATICCHECK) ./...

HELM         ?= $(shell command -v helm 2>/dev/null || echo $(CURDIR)/bin/helm)
HELM_VERSION ?= v3.22.0
# staticcheck's default checks: correctness (SA), simplifications (S), style (ST1000-series
# off by default) and unused code (U1000). A finding read on purpose carries a
# //lint:ignore with its reason on the line above. v0.8.2 is the module version of release 2026.2.2.
STATICCHECK         ?= $(shell command -v staticcheck 2>/dev/null || echo $(CURDIR)/bin/staticcheck)
STATICCHECK_VERSION ?= v0.8.2

.PHONY: tools
tools: ## Build helm (chart goldens) and staticcheck (lint) into ./bin from the Go module proxy.
	@test -x $(CURDIR)/bin/helm || GOBIN=$(CURDIR)/bin $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	@test -x $(CURDIR)/bin/staticcheck || GOBIN=$(CURDIR)/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: chart-golden
chart-golden: ## Re-render charts/kvrouter for each ci/*-values.yaml into examples/testdata/chart.
	@mkdir -p examples/testdata/chart
	@for v in charts/kvrouter/ci/*-values.yaml; do \
	  n=$$(basename $$v -values.yaml); \
	  $(HELM) template kvrouter charts/kvrouter --namespace llm --kube-version 1.33.0 -f $$v > examples/testdata/chart/$$n.yaml || exit 1; \
	  echo "examples/testdata/chart/$$n.yaml"; \
	done

.PHONY: test-docker
test-docker: ## Build the binaries with the Dockerfile's go build flags and check they are static.
	$(GO) test -tags dockerbuild -count=1 -run TestDockerfileBuildsStatic -v ./examples
