package kubernetes_test

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	infx "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/kvrouter/kvrouter/discovery"
	kdisc "github.com/kvrouter/kvrouter/discovery/kubernetes"
	"github.com/kvrouter/kvrouter/internal/testmetrics"
	"github.com/kvrouter/kvrouter/internal/testwait"
)

// modelRewrite is an InferenceModelRewrite created at minute age of the test's epoch,
// referring to pool in group, with rules.
func modelRewrite(name, pool, group string, age int, rules ...infx.InferenceModelRewriteRule) *unstructured.Unstructured {
	o := &infx.InferenceModelRewrite{
		TypeMeta: metav1.TypeMeta{APIVersion: "inference.networking.x-k8s.io/v1alpha2", Kind: "InferenceModelRewrite"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, age, 0, 0, time.UTC))},
		Spec: infx.InferenceModelRewriteSpec{PoolRef: &infx.PoolObjectReference{Name: infx.ObjectName(pool), Group: infx.Group(group)},
			Rules: rules},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		panic(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

// rule matches models (none: a generic rule) and sends them to targets.
func rule(models []string, targets ...infx.TargetModel) infx.InferenceModelRewriteRule {
	r := infx.InferenceModelRewriteRule{Targets: targets}
	for _, m := range models {
		r.Matches = append(r.Matches, infx.Match{Model: &infx.ModelMatch{Value: m}})
	}
	return r
}

func target(model string, weight int32) infx.TargetModel {
	return infx.TargetModel{ModelRewrite: model, Weight: weight}
}

// lookups is what the source rewrites models to: model -> "rewrite:first target",
// absent when no rule applies.
func lookups(s *kdisc.Source, models ...string) map[string]string {
	out := map[string]string{}
	for _, m := range models {
		if d, ok := s.Lookup(m); ok {
			out[m] = d.Name + ":" + d.Targets[0].ModelRewrite
		}
	}
	return out
}

// With an InferencePool the source keeps the rules of the InferenceModelRewrites of the
// pool's namespace that refer to the pool, by the resource's precedence (exact over
// generic, then the oldest resource), follows their changes, and refuses a rewrite whose
// rules could not be applied, counting it, while the others apply.
func TestInferenceModelRewrites(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(vllmPod("a", "10.0.0.1", true))
	dyn := dynClient(pool(8000),
		modelRewrite("alias", "vllm-pool", "", 1, rule([]string{"small"}, target("small-v1", 0))),
		modelRewrite("canary", "vllm-pool", infv1.GroupName, 2,
			rule([]string{"small", "big"}, target("v1", 90), target("v2", 10)),
			rule(nil, target("base", 0))),
		modelRewrite("other-pool", "another-pool", "", 0, rule([]string{"big"}, target("elsewhere", 0))),
		modelRewrite("other-group", "vllm-pool", "example.com", 0, rule(nil, target("elsewhere", 0))),
	)
	reg := prometheus.NewRegistry()
	f := newFleet(t)
	s := poolSource(t, cs, dyn, f, discovery.Options{Metrics: discovery.NewMetrics(reg)})
	models := []string{"small", "big", "anything", "new"}
	if got := lookups(s, models...); len(got) != 0 {
		t.Fatalf("known before Run: %v", got)
	}
	start(t, s)
	wait := func(t *testing.T, want map[string]string) {
		t.Helper()
		testwait.For(t, "rewrites", func() bool { return maps.Equal(lookups(s, models...), want) })
	}
	objs := dyn.Resource(kdisc.InferenceModelRewrites).Namespace(ns)
	t.Run("the pool's rewrites by precedence", func(t *testing.T) {
		wait(t, map[string]string{"small": "alias:small-v1", "big": "canary:v1", "anything": "canary:base", "new": "canary:base"})
		waitView(t, f, []string{"10.0.0.1:8000"}, nil)
		if d, _ := s.Lookup("big"); len(d.Targets) != 2 || d.Targets[1].Weight != 10 || !d.Exact {
			t.Errorf("big's rule %+v, want both weighted targets, exact", d)
		}
	})
	t.Run("an older rewrite takes precedence", func(t *testing.T) {
		if _, err := objs.Create(ctx, modelRewrite("new", "vllm-pool", "", 0, rule([]string{"new"}, target("n1", 0)),
			rule(nil, target("older-base", 0))), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		wait(t, map[string]string{"small": "alias:small-v1", "big": "canary:v1", "anything": "new:older-base", "new": "new:n1"})
	})
	t.Run("an invalid rewrite is refused, the others apply", func(t *testing.T) {
		bad := modelRewrite("new", "vllm-pool", "", 0, rule([]string{"new"}, target("n1", 5), target("n2", 0)))
		if _, err := objs.Update(ctx, bad, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		wait(t, map[string]string{"small": "alias:small-v1", "big": "canary:v1", "anything": "canary:base", "new": "canary:base"})
		if n := testmetrics.Value(t, reg, "kvrouter_discovery_errors_total", "reason", "model_rewrite_invalid"); n == 0 {
			t.Error("the refused rewrite is not counted")
		}
		rws, refused := s.Rewrites()
		if len(rws) != 2 || rws[0].Name != "alias" || rws[1].Name != "canary" ||
			!strings.Contains(refused["new"], "1 of 2 targets have a weight") || len(refused) != 1 {
			t.Errorf("Rewrites() = %+v, refused %v", rws, refused)
		}
	})
	t.Run("deleted", func(t *testing.T) {
		for _, name := range []string{"alias", "new"} {
			if err := objs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		wait(t, map[string]string{"small": "canary:v1", "big": "canary:v1", "anything": "canary:base", "new": "canary:base"})
	})
}
