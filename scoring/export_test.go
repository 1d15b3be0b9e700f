package scoring

// SetCostHook makes every Pick of a kv or approximate policy call f with its candidates
// and their costs, before it returns (tests only: Pick's Decision carries no scores).
func SetCostHook(p Policy, f func(cands []Endpoint, costs []float64)) {
	switch p := p.(type) {
	case *KV:
		p.core.costHook = f
	case *Approximate:
		p.core.costHook = f
	default:
		panic("SetCostHook: not a kv or approximate policy")
	}
}
