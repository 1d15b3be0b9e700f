package tokenizer_test

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/tokenizer"
)

// Load a model's files (as vLLM has them) and tokenize a rendered chat prompt the
// way vLLM does for chat requests (add_special_tokens=false).
func ExampleLoadDir() {
	metrics := tokenizer.NewMetrics(prometheus.NewRegistry())
	tk, err := tokenizer.LoadDir(".cache/models/qwen3", tokenizer.WithMetrics(metrics, "qwen3"))
	var unsupported *tokenizer.UnsupportedError
	switch {
	case errors.As(err, &unsupported):
		fmt.Println("route this model by load:", unsupported)
		return
	case err != nil:
		fmt.Println(err)
		return
	}
	ids := tk.Encode("<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n", false)
	fmt.Println(ids, tk.Decode(ids))
}
