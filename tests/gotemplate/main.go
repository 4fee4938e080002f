// Command gotemplate is the oracle of the differential template test: it
// renders every case of a corpus with Go's text/template and the Sprig v3
// functions the Go operators register (sprig.TxtFuncMap minus env and
// expandenv), and prints the output or the error of each case as JSON.
//
// Usage: go run . corpus.json > expected.json
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"text/template"
	"unicode/utf8"

	"github.com/Masterminds/sprig/v3"

	"kms-operator/tests/gotemplate/model"
)

// SecretTemplateOptions is what the Go operators hand to a template for each
// secret key.
type SecretTemplateOptions = model.SecretTemplateOptions

// Case is one template of the corpus.
type Case struct {
	Name     string                            `json:"name"`
	Template string                            `json:"template"`
	Data     map[string]SecretTemplateOptions `json:"data,omitempty"`
}

// Corpus is the whole input file.
type Corpus struct {
	Data  map[string]SecretTemplateOptions `json:"data"`
	Cases []Case                           `json:"cases"`
}

// Result is what Go did with one case.
type Result struct {
	Name         string `json:"name"`
	Output       string `json:"output,omitempty"`
	OutputBase64 []byte `json:"outputBase64,omitempty"`
	Error        string `json:"error,omitempty"`
}

func render(funcs template.FuncMap, c Case, data map[string]SecretTemplateOptions) (res Result) {
	res.Name = c.Name
	defer func() {
		if r := recover(); r != nil {
			res.Output = ""
			res.Error = fmt.Sprintf("panic: %v", r)
		}
	}()
	tmpl, err := template.New("t").Funcs(funcs).Parse(c.Template)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, data); err != nil {
		res.Error = err.Error()
		return res
	}
	if utf8.Valid(buf.Bytes()) {
		res.Output = buf.String()
	} else {
		res.OutputBase64 = buf.Bytes()
	}
	return res
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gotemplate CORPUS.json")
		os.Exit(2)
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var corpus Corpus
	if err := json.Unmarshal(raw, &corpus); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	results := make([]Result, 0, len(corpus.Cases))
	for _, c := range corpus.Cases {
		data := corpus.Data
		if c.Data != nil {
			data = c.Data
		}
		results = append(results, render(funcs, c, data))
	}
	out, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Stdout.Write(append(out, '\n'))
}
