// Package grafana checks the chart's dashboards against Grafana's own types: grafana-foundation-sdk's
// Dashboard.UnmarshalJSONStrict, with the default panel and query plugins registered, fails on missing
// required fields, wrong types and unknown fields in the dashboard, its panels' options and their queries.
// The Python SDK the quick tier uses ignores unknown keys, so this is the check that can say "Grafana would
// not read this" (docs/observability.md). Run by `make test-dashboards` when Go is present, and in .ci/run.
package grafana

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

const dashboards = "../../charts/rollout-router/dashboards"

func init() { plugins.RegisterDefaultPlugins() }

// load reads a dashboard file as a generic JSON object, minus the import-only keys Grafana's export adds
// (__inputs, __requires), which are not part of the dashboard model.
func load(t *testing.T, path string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: not JSON: %v", path, err)
	}
	delete(doc, "__inputs")
	delete(doc, "__requires")
	return doc
}

func strict(doc map[string]any) (*dashboard.Dashboard, error) {
	raw, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	var board dashboard.Dashboard
	return &board, failure(board.UnmarshalJSONStrict(raw))
}

// failure drops the empty error list the SDK returns on success: Dashboard.UnmarshalJSONStrict ends in
// `return errs` with errs a nil cog.BuildErrors, which is a non-nil error value (v0.0.22).
func failure(err error) error {
	var list cog.BuildErrors
	if errors.As(err, &list) && len(list) == 0 {
		return nil
	}
	return err
}

func files(t *testing.T) []string {
	t.Helper()
	found, err := filepath.Glob(filepath.Join(dashboards, "*.json"))
	if err != nil || len(found) == 0 {
		t.Fatalf("no dashboards under %s (%v)", dashboards, err)
	}
	return found
}

func TestEveryDashboardDecodesStrictly(t *testing.T) {
	for _, path := range files(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			doc := load(t, path)
			board, err := strict(doc)
			if err != nil {
				t.Fatalf("Grafana's types refuse %s:\n%v", path, err)
			}
			panels, _ := doc["panels"].([]any)
			if len(board.Panels) != len(panels) || len(panels) == 0 {
				t.Fatalf("%d panels decoded of %d in the file", len(board.Panels), len(panels))
			}
			for _, item := range board.Panels {
				if item.Panel == nil {
					continue // a row
				}
				panel := item.Panel
				if panel.Options == nil {
					t.Errorf("panel %q (%s): no typed options", deref(panel.Title), panel.Type)
				}
				for _, target := range panel.Targets {
					if target == nil {
						t.Errorf("panel %q: a query did not decode", deref(panel.Title))
					}
				}
			}
		})
	}
}

// The checks above only mean something if the decoder refuses what Grafana would refuse: one mistake of each
// kind, applied to a copy of the real dashboard, must fail.
func TestStrictDecodingRefusesMistakes(t *testing.T) {
	path := files(t)[0]
	mistakes := []struct {
		name, names string // names: what the error must mention
		apply       func(map[string]any)
	}{
		{"unknown dashboard field", "refreshEvery", func(d map[string]any) { d["refreshEvery"] = "30s" }},
		{"wrong type", "graphTooltip", func(d map[string]any) { d["graphTooltip"] = "shared" }},
		{"unknown panel option", "legendz", func(d map[string]any) {
			firstPanel(d)["options"].(map[string]any)["legendz"] = map[string]any{}
		}},
		{"missing stat option", "wideLayout", func(d map[string]any) {
			delete(firstStat(d)["options"].(map[string]any), "wideLayout")
		}},
	}
	for _, mistake := range mistakes {
		t.Run(mistake.name, func(t *testing.T) {
			doc := load(t, path)
			mistake.apply(doc)
			_, err := strict(doc)
			if err == nil || !strings.Contains(err.Error(), mistake.names) {
				t.Fatalf("strict decoding of a dashboard with a %s: want an error naming %q, got %v",
					mistake.name, mistake.names, err)
			}
		})
	}
}

func firstPanel(doc map[string]any) map[string]any {
	for _, item := range doc["panels"].([]any) {
		panel := item.(map[string]any)
		if panel["type"] != "row" && panel["options"] != nil {
			return panel
		}
	}
	panic("no panel with options")
}

func firstStat(doc map[string]any) map[string]any {
	for _, item := range doc["panels"].([]any) {
		if panel := item.(map[string]any); panel["type"] == "stat" {
			return panel
		}
	}
	panic("no stat panel")
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return strings.TrimSpace(*s)
}
