# kvrouter: run `make help` for the targets.
GO       ?= go
BIN      ?= bin
FUZZTIME ?= 20s

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build every command into ./bin.
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

.PHONY: demo
demo: models build ## Run kvrouter on a local simulated fleet behind a gateway; compare round-robin and kv.
	$(BIN)/kvdemo --bin $(BIN)

.PHONY: models
models: ## Fetch the tokenizer files the tests use into .cache/models (sha256-verified).
	bash scripts/fetch-models.sh

.PHONY: test
test: models ## Run all tests with the race detector, then the full tokenizer golden proof without it.
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run '^TestGolden$$' ./tokenizer/

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

.PHONY: lint
lint: ## gofmt and go vet.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet ./...
