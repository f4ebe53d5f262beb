// dashlint: lints a Grafana dashboard JSON with the rules of grafana/dashboard-linter that apply to a
// dashboard selecting its operator by `namespace` (grafana/dashboard-linter itself cannot be built
// from the Go module proxy here: its dependency github.com/grafana/grafana/apps/dashboard is not
// served, and it depends on github.com/grafana/loki/v3, which is AGPL). Every PromQL expression is
// parsed with the Prometheus parser of the same module promtool is built from.
//
// Rules (dashboard-linter's names where one exists):
//
//	template-datasource-rule      a `datasource` variable of type datasource, query prometheus
//	template-on-time-change-reload-rule  query variables refresh on time range change (refresh 2)
//	panel-datasource-rule         every panel and target uses the `${datasource}` variable
//	panel-title-description-rule  every panel has a title and a description
//	panel-units-rule              every stat/timeseries/gauge/bargauge panel sets a known unit
//	target-promql-rule            every expression parses as PromQL (Grafana variables substituted)
//	target-rate-interval-rule     rate()/irate() ranges are $__rate_interval
//	target-namespace-rule         every selector of an orchard_ metric matches namespace=~"$namespace"
//	                              (ours: replaces target-job-rule / target-instance-rule, which ask
//	                              for job and instance variables this dashboard does not use)
//	panel-id-rule                 panel ids are unique; panels do not overlap on the grid
//
// A `.lint` file next to the dashboard (YAML-free: one `rule-name  # why` per line) excludes rules;
// every exclusion must carry a reason after `#`.
//
// Usage: dashlint DASHBOARD.json   (exit 1 and one line per problem when the dashboard fails)
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type dashboard struct {
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type variable struct {
	Name    string          `json:"name"`
	Type    string          `json:"type"`
	Query   json.RawMessage `json:"query"`
	Refresh int             `json:"refresh"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int                      `json:"id"`
	Type        string                   `json:"type"`
	Title       string                   `json:"title"`
	Description string                   `json:"description"`
	Datasource  *datasource              `json:"datasource"`
	GridPos     struct{ X, Y, W, H int } `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []struct {
		RefID      string      `json:"refId"`
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// Units Grafana knows that this dashboard may use (a subset of Grafana's unit ids).
var units = map[string]bool{
	"short": true, "none": true, "percent": true, "percentunit": true, "s": true, "ms": true, "µs": true,
	"ns": true, "ops": true, "reqps": true, "rps": true, "wps": true, "iops": true, "bytes": true,
	"decbytes": true, "Bps": true, "binBps": true, "dtdurations": true, "m": true, "h": true, "d": true,
	"bool": true, "bool_yes_no": true,
}

var problems []string

func report(rule, format string, args ...interface{}) {
	if excluded[rule] {
		return
	}
	problems = append(problems, fmt.Sprintf("[%s] %s", rule, fmt.Sprintf(format, args...)))
}

var excluded = map[string]bool{}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dashlint DASHBOARD.json")
		os.Exit(2)
	}
	path := os.Args[1]
	if err := readExclusions(filepath.Join(filepath.Dir(path), ".lint")); err != nil {
		fmt.Fprintln(os.Stderr, "dashlint:", err)
		os.Exit(2)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashlint:", err)
		os.Exit(2)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		fmt.Fprintf(os.Stderr, "dashlint: %s: %v\n", path, err)
		os.Exit(2)
	}
	lint(&d)
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Println(p)
		}
		fmt.Fprintf(os.Stderr, "dashlint: %s: %d problem(s)\n", path, len(problems))
		os.Exit(1)
	}
	fmt.Printf("dashlint: %s: ok (%d panels)\n", path, countPanels(d.Panels))
}

func readExclusions(path string) error {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	} else if err != nil {
		return err
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	for line := 1; scanner.Scan(); line++ {
		text := strings.TrimSpace(scanner.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		rule, why, ok := strings.Cut(text, "#")
		if !ok || strings.TrimSpace(why) == "" {
			return fmt.Errorf("%s:%d: an exclusion needs a reason after '#'", path, line)
		}
		excluded[strings.TrimSpace(rule)] = true
	}
	return scanner.Err()
}

func countPanels(ps []panel) int {
	n := 0
	for _, p := range ps {
		n += 1 + countPanels(p.Panels)
	}
	return n
}

func lint(d *dashboard) {
	var hasDatasource bool
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && strings.Contains(string(v.Query), "prometheus") {
			hasDatasource = true
		}
		if v.Type == "query" && v.Refresh != 2 {
			report("template-on-time-change-reload-rule", "variable %q: refresh is %d, want 2 (on time range change)", v.Name, v.Refresh)
		}
	}
	if !hasDatasource {
		report("template-datasource-rule", "no `datasource` variable of type datasource querying prometheus")
	}
	ids := map[int]string{}
	var all []panel
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			all = append(all, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, p := range all {
		name := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if other, dup := ids[p.ID]; dup {
			report("panel-id-rule", "%s: id already used by %s", name, other)
		}
		ids[p.ID] = name
		if p.Title == "" {
			report("panel-title-description-rule", "%s: no title", name)
		}
		if p.Type == "row" {
			continue
		}
		if p.Description == "" {
			report("panel-title-description-rule", "%s: no description", name)
		}
		if p.Datasource == nil || !isVariable(p.Datasource.UID) {
			report("panel-datasource-rule", "%s: datasource is not ${datasource}", name)
		}
		switch p.Type {
		case "stat", "timeseries", "gauge", "bargauge":
			if !units[p.FieldConfig.Defaults.Unit] {
				report("panel-units-rule", "%s: unit %q is not a known Grafana unit", name, p.FieldConfig.Defaults.Unit)
			}
		}
		if len(p.Targets) == 0 {
			report("target-promql-rule", "%s: no query", name)
		}
		for _, t := range p.Targets {
			where := fmt.Sprintf("%s target %s", name, t.RefID)
			if t.Datasource != nil && !isVariable(t.Datasource.UID) {
				report("panel-datasource-rule", "%s: datasource is not ${datasource}", where)
			}
			lintExpr(where, t.Expr)
		}
	}
	lintGrid(d.Panels)
}

func isVariable(uid string) bool { return uid == "${datasource}" || uid == "$datasource" }

// Grafana's built-in interval variables, replaced with a duration before parsing.
var intervals = []string{"$__rate_interval", "${__rate_interval}", "$__interval", "${__interval}", "$__range", "${__range}"}

func lintExpr(where, expr string) {
	if strings.TrimSpace(expr) == "" {
		report("target-promql-rule", "%s: empty expression", where)
		return
	}
	const marker = "7331s" // a duration no one writes: marks where $__rate_interval stood
	text := strings.ReplaceAll(expr, "$__rate_interval", marker)
	text = strings.ReplaceAll(text, "${__rate_interval}", marker)
	for _, v := range intervals {
		text = strings.ReplaceAll(text, v, "5m")
	}
	text = expandVariables(text)
	node, err := parser.NewParser(parser.Options{}).ParseExpr(text)
	if err != nil {
		report("target-promql-rule", "%s: %v (in %s)", where, err, expr)
		return
	}
	parser.Inspect(node, func(n parser.Node, path []parser.Node) error {
		switch n := n.(type) {
		case *parser.Call:
			if n.Func.Name == "rate" || n.Func.Name == "irate" {
				for _, arg := range n.Args {
					if m, ok := arg.(*parser.MatrixSelector); ok && m.Range.String() != "2h2m11s" {
						report("target-rate-interval-rule", "%s: %s() over [%s], want [$__rate_interval]", where, n.Func.Name, m.Range)
					}
				}
			}
		case *parser.VectorSelector:
			if !strings.HasPrefix(n.Name, "orchard_") {
				return nil
			}
			ok := false
			for _, m := range n.LabelMatchers {
				if m.Name == "namespace" && m.Type == labels.MatchRegexp && m.Value == "VAR_namespace" {
					ok = true
				}
			}
			if !ok {
				report("target-namespace-rule", "%s: %s has no namespace=~\"$namespace\" matcher", where, n.Name)
			}
		}
		return nil
	})
}

// expandVariables replaces $name and ${name} with VAR_name (a plain label value or identifier).
func expandVariables(text string) string {
	var b strings.Builder
	for i := 0; i < len(text); i++ {
		if text[i] != '$' {
			b.WriteByte(text[i])
			continue
		}
		j := i + 1
		braced := j < len(text) && text[j] == '{'
		if braced {
			j++
		}
		start := j
		for j < len(text) && (text[j] == '_' || text[j] >= 'a' && text[j] <= 'z' || text[j] >= 'A' && text[j] <= 'Z' || text[j] >= '0' && text[j] <= '9') {
			j++
		}
		name := text[start:j]
		if braced && j < len(text) && text[j] == '}' {
			j++
		}
		b.WriteString("VAR_" + name)
		i = j - 1
	}
	return b.String()
}

func lintGrid(ps []panel) {
	sorted := append([]panel(nil), ps...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].ID < sorted[j].ID })
	for i, a := range sorted {
		if a.GridPos.X+a.GridPos.W > 24 {
			report("panel-id-rule", "panel %d %q: extends past 24 grid columns", a.ID, a.Title)
		}
		for _, b := range sorted[i+1:] {
			if a.GridPos.X < b.GridPos.X+b.GridPos.W && b.GridPos.X < a.GridPos.X+a.GridPos.W &&
				a.GridPos.Y < b.GridPos.Y+b.GridPos.H && b.GridPos.Y < a.GridPos.Y+a.GridPos.H {
				report("panel-id-rule", "panels %d %q and %d %q overlap", a.ID, a.Title, b.ID, b.Title)
			}
		}
	}
}
