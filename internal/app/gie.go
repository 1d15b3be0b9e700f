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

// buildVersion and buildCommit name the build when the linker sets them (the Dockerfile:
// -X github.com/kvrouter/kvrouter/internal/app.buildVersion=...): an image is built
// without the repository's .git, so Go records no VCS revision in it.
var buildVersion, buildCommit string

// buildInfo is this build of kvrouter: ref its version, commit the VCS revision it was
// built from; the linker's buildVersion and buildCommit when set, else what Go recorded
// ("unknown" for what the build does not record).
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
	if buildVersion != "" {
		ref = buildVersion
	}
	if buildCommit != "" {
		commit = buildCommit
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
