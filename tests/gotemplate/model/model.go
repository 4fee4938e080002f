// Package model holds the type the Go operators hand to templates, with the
// name and JSON tags they give it (so `typeOf`, `%T` and `toJson` print what
// they print).
package model

// SecretTemplateOptions is one secret as a template sees it.
type SecretTemplateOptions struct {
	Value      string `json:"value"`
	SecretPath string `json:"secretPath"`
}
