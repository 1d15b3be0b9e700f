package jinja

import (
	"fmt"
	"math/big"
	"testing"
)

// TestIntComparisonOperands: a comparison whose operands are an int constant or an
// int attribute of a loop or a namespace (intOperand's fast path) renders what the
// same comparison renders through the interpreter's Values, which `+ 0` (an addExpr,
// never a fast operand) forces, for every operator and for namespace values of every
// kind, errors included.
func TestIntComparisonOperands(t *testing.T) {
	values := map[string]Value{
		"int": Int(1), "negative": Int(-3), "bool": Bool(true), "float": Float(1.5),
		"bigint": BigInt(new(big.Int).Lsh(big.NewInt(1), 70)), "none": None(), "string": String("1"),
	}
	ops := []string{"==", "!=", "<", "<=", ">", ">="}
	for name, v := range values {
		for _, op := range ops {
			t.Run(name+" "+op, func(t *testing.T) {
				// Each pair compares the fast form with the forced one: loop
				// attributes against the namespace's value, the namespace's value
				// against a constant, a constant against a loop attribute, and an
				// attribute the namespace lacks.
				pairs := [][2]string{
					{"loop.index0 %s ns.v", "(loop.index0 + 0) %s ns.v"},
					{"loop.index %s ns.v", "(loop.index + 0) %s ns.v"},
					{"loop.revindex %s ns.v", "(loop.revindex + 0) %s ns.v"},
					{"loop.revindex0 %s ns.v", "(loop.revindex0 + 0) %s ns.v"},
					{"loop.length %s ns.v", "(loop.length + 0) %s ns.v"},
					{"ns.v %s 1", "ns.v %s (1 + 0)"},
					{"2 %s loop.index", "2 %s (loop.index + 0)"},
					{"loop.first %s 1", "loop.first %s (1 + 0)"},
					{"ns.missing %s 1", "ns.missing %s (1 + 0)"},
				}
				for _, p := range pairs {
					fast, forced := fmt.Sprintf(p[0], op), fmt.Sprintf(p[1], op)
					tmpl := `{% set ns = namespace(v=v) %}{% for x in [1, 2, 3] %}{{ ` + fast + ` }},{{ ` + forced + ` }};{% endfor %}`
					got, err := render(t, tmpl, MapVars{"v": v})
					want, wantErr := render(t, `{% set ns = namespace(v=v) %}{% for x in [1, 2, 3] %}{{ `+forced+` }},{{ `+forced+` }};{% endfor %}`, MapVars{"v": v})
					if fmt.Sprint(err) != fmt.Sprint(wantErr) || got != want {
						t.Errorf("%s: got %q, %v; the interpreter's %s gives %q, %v", fast, got, err, forced, want, wantErr)
					}
				}
			})
		}
	}
}
