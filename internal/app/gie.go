package app

import (
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/config"
)

// poolName is the name label of the Inference Extension's inference_pool_* series: the
// InferencePool the endpoints come from, or "" (the fleet's default) without one.
func poolName(cfg *config.Config) string {
	if k := cfg.Discovery.Kubernetes; k != nil {
		return k.InferencePool
	}
	return ""
}

// buildInfo is this build of kvrouter: ref its module version, commit the VCS revision
// the binary was built from ("unknown" for what the build does not record).
func buildInfo() (ref, commit string) {
	commit, ref = "unknown", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" {
			ref = v
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				commit = s.Value
			}
		}
	}
	return ref, commit
}

// newExtensionInfo is the Inference Extension's inference_extension_info series for this
// build (buildInfo): commit and build_ref.
func newExtensionInfo() prometheus.Collector {
	ref, commit := buildInfo()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "inference_extension_info",
		Help:        "Inference Extension series: 1, labelled with the build of the picker (here kvrouter's): commit, build_ref.",
		ConstLabels: prometheus.Labels{"commit": commit, "build_ref": ref},
	}, func() float64 { return 1 })
}
