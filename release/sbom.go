package main

// A CycloneDX 1.5 SBOM of a Rust binary's crates, from `cargo metadata`:
// the package's dependency tree as cargo resolved it (normal dependencies,
// followed transitively), each crate with its version, licence and purl.

import (
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"
)

type cargoMetadata struct {
	Packages []struct {
		ID      string `json:"id"`
		Name    string `json:"name"`
		Version string `json:"version"`
		License string `json:"license"`
		Source  string `json:"source"`
	} `json:"packages"`
	Resolve struct {
		Nodes []struct {
			ID   string `json:"id"`
			Deps []struct {
				Pkg      string `json:"pkg"`
				DepKinds []struct {
					Kind *string `json:"kind"`
				} `json:"dep_kinds"`
			} `json:"deps"`
		} `json:"nodes"`
	} `json:"resolve"`
}

type component struct {
	Type     string    `json:"type"`
	BomRef   string    `json:"bom-ref"`
	Name     string    `json:"name"`
	Version  string    `json:"version"`
	Purl     string    `json:"purl"`
	Licenses []license `json:"licenses,omitempty"`
}

type license struct {
	Expression string `json:"expression"`
}

func sbomCmd(args []string) error {
	fl := flag.NewFlagSet("sbom", flag.ContinueOnError)
	metadataFile := fl.String("metadata", "", "output of cargo metadata --format-version 1")
	pkg := fl.String("package", "", "the binary's package")
	out := fl.String("out", "", "the SBOM to write")
	epochSecs := fl.Int64("epoch", 0, "the SBOM's timestamp (SOURCE_DATE_EPOCH)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	raw, err := os.ReadFile(*metadataFile)
	if err != nil {
		return err
	}
	var md cargoMetadata
	if err := json.Unmarshal(raw, &md); err != nil {
		return fmt.Errorf("%s: %v", *metadataFile, err)
	}
	byID := map[string]int{}
	rootID := ""
	for i, p := range md.Packages {
		byID[p.ID] = i
		if p.Name == *pkg && p.Source == "" {
			rootID = p.ID
		}
	}
	if rootID == "" {
		return fmt.Errorf("no workspace package %q in the metadata", *pkg)
	}
	deps := map[string][]string{}
	for _, n := range md.Resolve.Nodes {
		for _, d := range n.Deps {
			normal := false
			for _, k := range d.DepKinds {
				if k.Kind == nil {
					normal = true
				}
			}
			if normal {
				deps[n.ID] = append(deps[n.ID], d.Pkg)
			}
		}
	}
	seen := map[string]bool{rootID: true}
	queue := []string{rootID}
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		for _, d := range deps[id] {
			if !seen[d] {
				seen[d] = true
				queue = append(queue, d)
			}
		}
	}
	toComponent := func(id, kind string) component {
		p := md.Packages[byID[id]]
		c := component{
			Type:    kind,
			BomRef:  fmt.Sprintf("pkg:cargo/%s@%s", p.Name, p.Version),
			Name:    p.Name,
			Version: p.Version,
			Purl:    fmt.Sprintf("pkg:cargo/%s@%s", p.Name, p.Version),
		}
		if p.License != "" {
			c.Licenses = []license{{Expression: p.License}}
		}
		return c
	}
	var components []component
	var dependencies []map[string]any
	for id := range seen {
		if id != rootID {
			components = append(components, toComponent(id, "library"))
		}
		var on []string
		for _, d := range deps[id] {
			p := md.Packages[byID[d]]
			on = append(on, fmt.Sprintf("pkg:cargo/%s@%s", p.Name, p.Version))
		}
		sort.Strings(on)
		p := md.Packages[byID[id]]
		dependencies = append(dependencies, map[string]any{
			"ref":       fmt.Sprintf("pkg:cargo/%s@%s", p.Name, p.Version),
			"dependsOn": on,
		})
	}
	sort.Slice(components, func(i, j int) bool { return components[i].BomRef < components[j].BomRef })
	sort.Slice(dependencies, func(i, j int) bool {
		return dependencies[i]["ref"].(string) < dependencies[j]["ref"].(string)
	})
	root := toComponent(rootID, "application")
	// A serial number derived from what the SBOM describes: the same tree
	// gives the same document.
	sum := sha256.Sum256(raw)
	serial := fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
	bom := map[string]any{
		"bomFormat":    "CycloneDX",
		"specVersion":  "1.5",
		"serialNumber": serial,
		"version":      1,
		"metadata": map[string]any{
			"timestamp": time.Unix(*epochSecs, 0).UTC().Format(time.RFC3339),
			"tools":     []map[string]string{{"name": "kms-release sbom"}},
			"component": root,
		},
		"components":   components,
		"dependencies": dependencies,
	}
	text, err := json.MarshalIndent(bom, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(*out, append(text, '\n'), 0o644)
}
