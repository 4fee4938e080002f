#!/usr/bin/env python3
"""Writes corpus.json: the templates of the differential Go-template test.

Every case is a Go template rendered by the Go oracle (main.go) and by the
Rust engine (template/tests/gotemplate.rs). A case with "deliberate" is one
where the Rust engine refuses on purpose; the reason is the value.

Run: python3 gen_corpus.py > corpus.json   (bless.sh does it)
"""

import itertools
import json

DATA = {
    "DB_PASSWORD": {"value": "s3cr3t!", "secretPath": "/"},
    "DB_USER": {"value": "app", "secretPath": "/"},
    "HOST": {"value": "db.example.com", "secretPath": "/db"},
    "PORT": {"value": "5432", "secretPath": "/db"},
    "JSON": {"value": '{"a":1,"b":[1,2,"x"],"c":{"d":"e"},"f":1.5,"n":null,"t":true}', "secretPath": "/"},
    "YAMLISH": {"value": "key: value", "secretPath": "/"},
    "LIST": {"value": "a,b,c", "secretPath": "/"},
    "EMPTY": {"value": "", "secretPath": "/empty"},
    "B64": {"value": "aGVsbG8gd29ybGQ=", "secretPath": "/"},
    "MULTI": {"value": "line1\nline2\nline3", "secretPath": "/"},
    "my-key": {"value": "dash", "secretPath": "/x"},
    "dotted.key": {"value": "dot", "secretPath": "/x"},
    "NUM": {"value": "42", "secretPath": "/"},
    "FLOAT": {"value": "3.14", "secretPath": "/"},
    "BOOL": {"value": "true", "secretPath": "/"},
    "SPACES": {"value": "  padded  ", "secretPath": "/"},
    "UNICODE": {"value": "héllo wörld", "secretPath": "/"},
    "HTML": {"value": "<a href=\"x\">&</a>", "secretPath": "/"},
    "Ключ": {"value": "unicode key", "secretPath": "/"},
}

cases = []
names = set()


def add(name, template, data=None, deliberate=None):
    base = name
    n = 2
    while name in names:
        name = f"{base}#{n}"
        n += 1
    names.add(name)
    case = {"name": name, "template": template}
    if data is not None:
        case["data"] = data
    if deliberate is not None:
        case["deliberate"] = deliberate
    cases.append(case)


MISSING = "a missing key is an error (Go prints <no value> or a zero value)"
NONDET = "the function is not deterministic (refused)"
ENV = "the function reads the environment or the network (refused)"
UNIMPL = "the Sprig function is not implemented (refused as unsupported)"

# 1. Every template fragment of the Go operators' templating docs that does
# not use the operator's own helpers.
add("ref/value", "{{ .DB_PASSWORD.Value }}")
add("ref/secretPath", "{{ .DB_PASSWORD.SecretPath }}")
add("ref/index-non-identifier", '{{ (index . "my-key").Value }}')
add("ref/missing-key", "{{ .MISSING.Value }}", deliberate=MISSING)
add("ref/helm-escape", '{{ "{{" }}')
add("ref/lowercase-field", "{{ .DB_PASSWORD.value }}")
add("ref/env-removed", '{{ env "HOME" }}', deliberate=ENV)
add("ref/expandenv-removed", '{{ expandenv "$HOME" }}', deliberate=ENV)

# 2. Data shape.
for t in [
    "{{ . }}", "{{ .HOST }}", "{{ .HOST.Value }}:{{ .PORT.Value }}",
    "{{ index . \"dotted.key\" }}", '{{ (index . "dotted.key").SecretPath }}',
    "{{ $.HOST.Value }}", "{{ with .HOST }}{{ .Value }}@{{ .SecretPath }}{{ end }}",
    "{{ len . }}", "{{ .EMPTY.Value }}", "[{{ .EMPTY.SecretPath }}]",
    "{{ if .EMPTY.Value }}set{{ else }}empty{{ end }}",
    "{{ printf \"%v\" .HOST }}", "{{ printf \"%+v\" .HOST }}", "{{ printf \"%s\" .HOST }}",
    "{{ printf \"%q\" .HOST }}", "{{ .HOST | printf \"%v\" }}",
    "{{ toJson .HOST }}", "{{ toPrettyJson .HOST }}", "{{ toJson . | len }}",
    "{{ .HOST.Value.Foo }}", "{{ .HOST.Other }}", "{{ .HOST.Value \"arg\" }}",
    "{{ eq .HOST .HOST }}", "{{ index . \"HOST\" \"x\" }}",
    "{{ range . }}{{ .SecretPath }},{{ end }}",
    "{{ range $k, $v := . }}{{ $k }}={{ $v.Value | len }};{{ end }}",
    "{{ hasKey . \"HOST\" }}", "{{ empty .HOST }}", "{{ default \"d\" .EMPTY.Value }}",
    "{{ typeOf .HOST.Value }}", "{{ kindOf .HOST }}", "{{ kindOf . }}",
]:
    add("data/" + t, t)
add("data/index-missing", '{{ index . "NOPE" }}', deliberate=MISSING)
add("data/missing-with", "{{ with .NOPE }}x{{ else }}none{{ end }}", deliberate=MISSING)
add("data/missing-if", "{{ if .NOPE }}x{{ else }}none{{ end }}", deliberate=MISSING)
add("data/missing-map-field", '{{ (dict "a" 1).b }}')
add("data/binary", "{{ .BIN.Value | len }}", data={"BIN": {"value": "\u00ff\u00fe", "secretPath": "/"}})
add("data/empty-data", "x{{ range . }}y{{ else }}none{{ end }}", data={})

# 3. Text, whitespace trimming, comments.
for t in [
    "plain text", "", "a {{ \"b\" }} c", "a  {{- \"b\" -}}  c", "a\n\t{{- \"b\" }}\n c",
    "a {{ \"b\" -}}\n\n c", "{{- \"x\" -}}", "a {{- /* comment */ -}} b", "a {{/* comment */}} b",
    "a {{/* multi\nline */}} b", "{{ 3 }}{{- 4 }}", "{{ -3 }}", "{{-3}}", "{{- -3 -}}",
    "x\n{{- if true }}\ny\n{{- end }}\nz", "{{ \"}}\" }}", "{{ `raw\\n` }}", "{{ \"esc\\t\\n\\\\\\\"\" }}",
    "{{ \"\\u00e9\\x41\\101\" }}", "{{ 'a' }}", "{{ '\\n' }}", "{{ '\\u00e9' }}",
    "{{/* unclosed", "{{ /* spaced */ }}", "{{ \"unterminated }}", "{{ 1 }", "{{ }}", "}} stray",
    "{{ .HOST.Value }}{{\n.PORT.Value\n}}", "{{ print\n1\n2 }}",
]:
    add("text/" + t, t)

# 4. Literals.
for t in [
    "{{ 1 }}", "{{ 1.0 }}", "{{ 1.5 }}", "{{ 1e6 }}", "{{ 1e21 }}", "{{ 1e-5 }}", "{{ 0.0001 }}",
    "{{ 123456789.0 }}", "{{ 0x1F }}", "{{ 0X1f }}", "{{ 0o17 }}", "{{ 017 }}", "{{ 0b101 }}",
    "{{ 1_000_000 }}", "{{ -0 }}", "{{ +5 }}", "{{ 0x1p4 }}", "{{ 9223372036854775807 }}",
    "{{ 9223372036854775808 }}", "{{ -9223372036854775808 }}", "{{ 1e100 }}", "{{ .5 }}",
    "{{ true }}", "{{ false }}", "{{ nil }}", "{{ \"\" }}", "{{ 1x }}", "{{ 0x }}", "{{ 1__0 }}",
    "{{ printf \"%T\" 1 }}", "{{ printf \"%T\" 1.0 }}", "{{ printf \"%T\" 'a' }}", "{{ printf \"%T\" 0x10 }}",
    "{{ printf \"%T\" 1e3 }}", "{{ printf \"%T\" \"s\" }}", "{{ printf \"%T\" true }}",
    "{{ printf \"%T\" nil }}", "{{ printf \"%T\" (list) }}", "{{ printf \"%T\" (dict) }}",
]:
    add("literal/" + t, t)

# 5. Pipelines, variables, parentheses.
for t in [
    "{{ \"a\" | printf \"%s-%s\" \"b\" }}", "{{ .HOST.Value | upper | lower }}",
    "{{ \"x\" | len }}", "{{ 1 | print 2 3 }}", "{{ (print 1 2) }}", "{{ (len \"abc\") | print }}",
    "{{ $x := 1 }}{{ $x }}", "{{ $x := 1 }}{{ $x = 2 }}{{ $x }}", "{{ $x := .HOST }}{{ $x.Value }}",
    "{{ $ }}", "{{ $.PORT.Value }}", "{{ $x }}", "{{ $x = 1 }}", "{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ end }}{{ $x }}",
    "{{ if true }}{{ $y := 1 }}{{ end }}{{ $y }}", "{{ $a, $b := 1 }}",
    "{{ $x := list 1 2 }}{{ range $x }}{{ . }}{{ end }}", "{{ (list 1 2 3) | len }}",
    "{{ 1 | 2 }}", "{{ print | 2 }}", "{{ \"x\" | \"y\" }}", "{{ len | print }}", "{{ .HOST | . }}",
    "{{ (1) }}", "{{ (1).x }}", "{{ (dict \"a\" (dict \"b\" 2)).a.b }}", "{{ $d := dict \"a\" 1 }}{{ $d.a }}",
    "{{ print (1) (2) }}", "{{ ( print 1 ) }}", "{{ (print 1) 2 }}", "{{ \"x\" 2 }}", "{{ true 1 }}",
    "{{ nil 1 }}", "{{ . 1 }}", "{{ $ 1 }}", "{{ print nil }}", "{{ len nil }}", "{{ (nil).x }}",
    "{{ printf \"%d\" (len .) }}", "{{ $x := 5 }}{{ $x | printf \"%03d\" }}",
    "{{ not true }}", "{{ not 0 }}", "{{ not \"\" }}", "{{ not (list) }}", "{{ not . }}",
    "{{ and 1 2 }}", "{{ and 0 2 }}", "{{ and 1 \"\" }}", "{{ or 0 \"\" }}", "{{ or 0 \"x\" 3 }}",
    "{{ and }}", "{{ or 1 }}", "{{ and 1 (fail \"not evaluated\") }}", "{{ or 1 (fail \"not evaluated\") }}",
    "{{ and 0 (fail \"not evaluated\") }}", "{{ or 0 (fail \"evaluated\") }}", "{{ 1 | and 2 }}", "{{ 0 | or \"\" }}",
    "{{ and (list) 1 }}", "{{ or (dict) (list 1) }}", "{{ and true nil }}",
    "{{ len \"héllo\" }}", "{{ len (list 1 2) }}", "{{ len (dict \"a\" 1) }}", "{{ len 3 }}",
    "{{ index \"abc\" 1 }}", "{{ index (list 1 2 3) 2 }}", "{{ index (list 1 2 3) 3 }}", "{{ index (list 1 2 3) -1 }}",
    "{{ index (list (list 1 2) (list 3 4)) 1 0 }}", "{{ index (dict \"a\" (dict \"b\" 5)) \"a\" \"b\" }}",
    "{{ index (dict \"a\" 1) \"b\" }}", "{{ index (list 1) \"0\" }}", "{{ index 3 0 }}", "{{ index (list 1 2) }}",
    "{{ index (dict \"a\" 1) 1 }}", "{{ index nil 0 }}", "{{ index (splitList \",\" \"a,b\") 1 }}",
    "{{ index (split \",\" \"a,b\") \"_1\" }}", "{{ index (split \",\" \"a,b\") \"_9\" }}",
    "{{ (split \",\" \"a,b\")._0 }}", "{{ (split \",\" \"a,b\")._7 }}",
    "{{ html \"<a href='x'>&\\\"</a>\" }}", "{{ html 1 2 }}", "{{ js \"it's <b>\\\"q\\\"</b> = \\\\\" }}",
    "{{ urlquery \"a b&c=d/é\" }}", "{{ urlquery 1 \"x\" }}", "{{ print 1 2 \"a\" \"b\" 3 nil true }}",
    "{{ println 1 \"a\" }}", "{{ print }}", "{{ println }}", "{{ print (list 1 \"a\") (dict \"k\" 1.5) }}",
    "{{ call 1 }}", "{{ nosuchfunc 1 }}", "{{ upper 1 }}", "{{ upper }}", "{{ upper \"a\" \"b\" }}",
    "{{ repeat \"3\" \"x\" }}", "{{ repeat 3.0 \"x\" }}", "{{ repeat (add 1 2) \"x\" }}", "{{ repeat (len \"ab\") \"x\" }}",
    "{{ repeat 2 1 }}", "{{ \"x\" | repeat 2 }}", "{{ 2 | repeat \"x\" }}", "{{ ternary 1 2 \"true\" }}",
    "{{ ternary 1 2 (eq 1 1) }}", "{{ first nil }}",
]:
    add("pipeline/" + t, t)

# 6. Control structures.
for t in [
    "{{ if 1 }}a{{ end }}", "{{ if 0 }}a{{ else }}b{{ end }}", "{{ if \"\" }}a{{ else if 0 }}b{{ else }}c{{ end }}",
    "{{ if false }}a{{ else if true }}b{{ else }}c{{ end }}", "{{ if (list) }}a{{ else }}empty{{ end }}",
    "{{ if (dict) }}a{{ else }}empty{{ end }}", "{{ if .HOST }}struct is true{{ end }}", "{{ if nil }}a{{ end }}",
    "{{ if $x := \"v\" }}{{ $x }}{{ end }}", "{{ if $x := \"\" }}{{ $x }}{{ else }}[{{ $x }}]{{ end }}",
    "{{ with \"v\" }}{{ . }}{{ end }}", "{{ with \"\" }}{{ . }}{{ else }}none{{ end }}",
    "{{ with $x := 5 }}{{ $x }}{{ . }}{{ end }}", "{{ with 0 }}a{{ else with 1 }}b{{ . }}{{ end }}",
    "{{ with 0 }}a{{ else with 0 }}b{{ else }}c{{ end }}",
    "{{ range list 1 2 3 }}{{ . }}{{ end }}", "{{ range $i, $v := list \"a\" \"b\" }}{{ $i }}{{ $v }}{{ end }}",
    "{{ range $v := list \"a\" \"b\" }}{{ $v }}{{ end }}", "{{ range list }}x{{ else }}empty{{ end }}",
    "{{ range $k, $v := dict \"b\" 2 \"a\" 1 \"c\" 3 }}{{ $k }}{{ $v }}{{ end }}",
    "{{ range dict \"b\" 2 \"a\" 1 }}{{ . }}{{ end }}", "{{ range 3 }}{{ . }}{{ end }}", "{{ range $i := 3 }}{{ $i }}{{ end }}",
    "{{ range $i, $v := 3 }}{{ $i }}{{ end }}", "{{ range 0 }}x{{ else }}none{{ end }}",
    "{{ range \"abc\" }}{{ . }}{{ end }}", "{{ range 1.5 }}{{ . }}{{ end }}", "{{ range true }}x{{ end }}",
    "{{ range nil }}x{{ else }}nil{{ end }}", "{{ range list 1 2 3 4 }}{{ if eq . 3 }}{{ break }}{{ end }}{{ . }}{{ end }}",
    "{{ range list 1 2 3 4 }}{{ if eq . 2 }}{{ continue }}{{ end }}{{ . }}{{ end }}", "{{ break }}", "{{ continue }}",
    "{{ range list 1 2 }}{{ range list \"a\" \"b\" }}{{ if eq . \"b\" }}{{ break }}{{ end }}{{ . }}{{ end }}{{ . }}{{ end }}",
    "{{ range $i, $e := list 1 2 }}{{ $x := $i }}{{ $x }}{{ end }}", "{{ $x := 0 }}{{ range list 1 2 3 }}{{ $x = . }}{{ end }}{{ $x }}",
    "{{ $i := 9 }}{{ $v := 8 }}{{ range $i, $v = list 5 6 }}{{ end }}{{ $i }}{{ $v }}",
    "{{ range $i, $v := splitList \",\" .LIST.Value }}{{ if $i }},{{ end }}{{ $v | upper }}{{ end }}",
    "{{ range .JSON.Value | fromJson }}{{ . }};{{ end }}", "{{ range $k, $v := .JSON.Value | fromJson }}{{ $k }}:{{ kindOf $v }};{{ end }}",
    "{{ if }}x{{ end }}", "{{ if 1 }}x", "{{ end }}", "{{ else }}", "{{ if 1 }}{{ else }}{{ else }}{{ end }}",
    "{{ range $a, $b, $c := list 1 }}{{ end }}", "{{ range $a, 1 := list 1 }}{{ end }}", "{{ if 1 }}a{{ else if }}b{{ end }}",
    "{{ range list 1 }}{{ else if 1 }}x{{ end }}", "{{ with 1 }}{{ else if 1 }}x{{ end }}",
    "{{ define \"t1\" }}[{{ . }}]{{ end }}{{ template \"t1\" \"x\" }}{{ template \"t1\" 2 }}",
    "{{ define \"t1\" }}[{{ . }}]{{ end }}{{ template \"t1\" }}", "{{ template \"nope\" }}",
    "{{ block \"b\" .HOST.Value }}<{{ . }}>{{ end }}", "{{ define \"rec\" }}{{ if . }}{{ . }}{{ template \"rec\" (sub . 1) }}{{ end }}{{ end }}{{ template \"rec\" 3 }}",
    "{{ define \"v\" }}{{ $ }}{{ end }}{{ template \"v\" 5 }}", "{{ if 1 }}{{ define \"x\" }}{{ end }}{{ end }}",
    "{{ define \"a\" }}1{{ end }}{{ define \"a\" }}2{{ end }}", "{{ define \"a\" }}{{ end }}{{ define \"a\" }}2{{ end }}{{ template \"a\" }}",
    "{{ range list 1 2 }}{{ define \"x\" }}{{ end }}{{ end }}", "{{ template \"x\" 1 2 }}",
    "{{ define \"t\" }}{{ break }}{{ end }}",
]:
    add("control/" + t, t)

# 7. Comparisons.
values = ["1", "2", "1.0", "1.5", "\"a\"", "\"b\"", "true", "(len \"x\")", "(add 1 0)", "(int64 1)", "nil", "(list)", "(index \"a\" 0)", ".HOST", "97"]
for f in ["eq", "ne", "lt", "le", "gt", "ge"]:
    for a, b in itertools.product(values, repeat=2):
        if f != "eq" and (a == "nil" or b == "nil"):
            continue
        if (a in ("(list)", ".HOST") or b in ("(list)", ".HOST")) and f not in ("eq", "lt"):
            continue
        add(f"compare/{f} {a} {b}", f"{{{{ {f} {a} {b} }}}}")
for t in ["{{ eq 1 2 3 1 }}", "{{ eq 1 }}", "{{ eq \"a\" \"b\" \"a\" }}", "{{ eq 1 \"a\" 1 }}", "{{ ne 1 }}", "{{ lt 1 2 3 }}",
          "{{ eq .HOST.Value \"db.example.com\" }}", "{{ eq .PORT.Value 5432 }}", "{{ eq (atoi .PORT.Value) 5432 }}",
          "{{ lt .PORT.Value \"6\" }}", "{{ eq (list) (list) }}", "{{ eq (dict) (dict) }}"]:
    add("compare/" + t, t)

# 8. printf.
verbs = ["%v", "%+v", "%s", "%q", "%d", "%5d", "%-5d|", "%05d", "%+d", "%x", "%X", "%#x", "%o", "%#o", "%O", "%b", "%c", "%U",
         "%e", "%E", "%f", "%.2f", "%8.3f", "%-8.2f|", "%g", "%G", "%.3g", "%t", "%T", "%10s", "%-10s|", "%.2s", "%05s", "% d", "%x", "%% %d"]
pvals = ["42", "-7", "3.14159", "\"héllo\"", "true", "(list 1 \"a\")", "(dict \"k\" 1)", "nil", "1e6", "0.000012", "255", "'A'", ".HOST"]
for v, a in itertools.product(verbs, pvals):
    add(f"printf/{v} {a}", f"{{{{ printf \"{v}\" {a} }}}}")
for t in ["{{ printf \"%d %d\" 1 }}", "{{ printf \"%d\" 1 2 }}", "{{ printf \"%d\" 1 \"x\" nil }}", "{{ printf \"%\" }}",
          "{{ printf \"%!\" 1 }}", "{{ printf \"no verbs\" }}", "{{ printf \"%s\" }}", "{{ printf 1 }}", "{{ printf }}",
          "{{ printf \"%6.2f|%-6.1f|%06.2f\" 3.14159 2.5 -1.5 }}", "{{ printf \"%x\" \"hi\" }}", "{{ printf \"% x\" \"hi\" }}",
          "{{ printf \"%X\" \"hi\" }}", "{{ printf \"%q\" \"tab\\there\\n\" }}", "{{ printf \"%#q\" \"raw\" }}",
          "{{ printf \"%+q\" \"é\" }}", "{{ printf \"%v %v\" 1e20 1e21 }}", "{{ printf \"%v\" 100000.0 }}",
          "{{ printf \"%v\" 1234567.0 }}", "{{ printf \"%g\" 1e-7 }}", "{{ printf \"%.0f\" 2.5 }}", "{{ printf \"%.0f\" 3.5 }}",
          "{{ printf \"%.1f\" 0.05 }}", "{{ printf \"%5.1f%%\" 99.5 }}", "{{ printf \"%s=%s\" \"k\" .HOST.Value }}",
          "{{ printf \"%d\" (add 1 2) }}", "{{ printf \"%v\" (float64 2) }}", "{{ printf \"%s\" (list \"a\" \"b\") }}",
          "{{ printf \"%d\" (list 1 2) }}", "{{ printf \"%q\" (list \"a\" 1) }}", "{{ printf \"%s\" (dict \"k\" \"v\") }}"]:
    add("printf/" + t, t)

# 9. Sprig functions.
S = [
    # strings
    '{{ trim "  x y  " }}', '{{ trim .SPACES.Value }}', '{{ trim "\\t\\n x \\r" }}', '{{ upper "héllo" }}', '{{ lower "HÉLLO" }}',
    '{{ title "hello wOrld-foo_bar baz.qux" }}', '{{ untitle "Hello World" }}', '{{ substr 1 3 "hello" }}', '{{ substr 0 10 "hello" }}',
    '{{ substr -1 2 "hello" }}', '{{ substr 3 1 "hello" }}', '{{ substr 9 10 "hello" }}', '{{ trunc 3 "hello" }}', '{{ trunc -2 "hello" }}',
    '{{ trunc 10 "hi" }}', '{{ trunc -10 "hi" }}', '{{ abbrev 5 "hello world" }}', '{{ abbrev 3 "hello" }}', '{{ abbrev 20 "hello" }}',
    '{{ abbrevboth 5 10 "1234 5678 9123" }}', '{{ repeat 3 "ab" }}', '{{ repeat 0 "ab" }}', '{{ repeat -1 "ab" }}',
    '{{ trimAll "$" "$$5.00$" }}', '{{ trimall "ab" "abcba" }}', '{{ trimSuffix "-" "hello-" }}', '{{ trimPrefix "-" "-hello" }}',
    '{{ nospace "h e l\\tl o" }}', '{{ initials "hello big world" }}', '{{ swapcase "Hello World" }}',
    '{{ contains "cat" "catch" }}', '{{ contains "" "x" }}', '{{ hasPrefix "cat" "catch" }}', '{{ hasSuffix "ch" "catch" }}',
    '{{ quote "a" "b\\"c" }}', '{{ quote 1 nil true }}', '{{ quote }}', '{{ squote "a" 1 }}', '{{ squote nil }}', '{{ quote .HOST.Value }}',
    '{{ cat "a" 1 nil "b" }}', '{{ cat }}', '{{ indent 2 "a\\nb" }}', '{{ nindent 4 "a\\nb" }}', '{{ indent 0 "x" }}', '{{ indent -1 "x" }}',
    '{{ .MULTI.Value | indent 2 }}', '{{ .MULTI.Value | nindent 2 }}', '{{ replace "a" "b" "banana" }}', '{{ replace "" "-" "abc" }}',
    '{{ "banana" | replace "an" "AN" }}', '{{ plural "one" "many" 1 }}', '{{ plural "one" "many" 2 }}', '{{ sha1sum "abc" }}',
    '{{ sha256sum "abc" }}', '{{ sha512sum "abc" }}', '{{ adler32sum "abc" }}', '{{ .DB_PASSWORD.Value | sha256sum }}',
    '{{ toString 1 }}', '{{ toString 1.5 }}', '{{ toString nil }}', '{{ toString (list 1 2) }}', '{{ toString true }}', '{{ toString .HOST }}',
    '{{ "x" | toString | upper }}',
    # numbers
    '{{ atoi "42" }}', '{{ atoi "-7" }}', '{{ atoi "4x" }}', '{{ atoi " 4" }}', '{{ atoi "+5" }}', '{{ atoi .PORT.Value | add 1 }}',
    '{{ int "42" }}', '{{ int "0x10" }}', '{{ int "1.0" }}', '{{ int "1.5" }}', '{{ int 3.9 }}', '{{ int -3.9 }}', '{{ int true }}',
    '{{ int nil }}', '{{ int "010" }}', '{{ int64 "42" }}', '{{ printf "%T" (int64 1) }}', '{{ printf "%T" (int 1) }}',
    '{{ float64 "3.5" }}', '{{ float64 2 }}', '{{ float64 "x" }}', '{{ float64 "1e3" }}', '{{ printf "%T" (float64 1) }}',
    '{{ add 1 2 3 }}', '{{ add }}', '{{ add "2" 3.7 }}', '{{ add1 5 }}', '{{ sub 5 3 }}', '{{ div 7 2 }}', '{{ div -7 2 }}',
    '{{ div 1 0 }}', '{{ mod 7 3 }}', '{{ mod -7 3 }}', '{{ mod 1 0 }}', '{{ mul 2 3 4 }}', '{{ mul 5 }}', '{{ max 1 5 3 }}',
    '{{ min 4 2 8 }}', '{{ biggest 1 9 }}', '{{ max "7" 2 }}', '{{ addf 1.1 2.2 }}', '{{ add1f 1.5 }}', '{{ subf 1.5 0.2 }}',
    '{{ mulf 1.1 3 }}', '{{ divf 10 4 }}', '{{ divf 1 3 }}', '{{ divf 2 3 }}', '{{ divf 1 0 }}', '{{ addf }}', '{{ maxf 1.5 2.5 -1 }}',
    '{{ minf 1.5 2.5 -1 }}', '{{ ceil 1.2 }}', '{{ floor 1.8 }}', '{{ ceil "2.1" }}', '{{ round 3.14159 2 }}', '{{ round 2.5 0 }}',
    '{{ round 1.2345 3 0.4 }}', '{{ seq 5 }}', '{{ seq 2 5 }}', '{{ seq 5 2 }}', '{{ seq 0 2 10 }}', '{{ seq 10 -3 1 }}', '{{ seq }}',
    '{{ seq 1 2 3 4 }}', '{{ until 5 }}', '{{ until -3 }}', '{{ until 0 }}', '{{ untilStep 0 10 3 }}', '{{ untilStep 10 0 -4 }}',
    '{{ untilStep 0 10 0 }}', '{{ toDecimal "0777" }}', '{{ toDecimal 17 }}', '{{ toDecimal "9" }}', '{{ range until 3 }}{{ . }}{{ end }}',
    '{{ printf "%T" (until 2) }}', '{{ len (until 4) }}', '{{ add 9223372036854775807 1 }}',
    # lists
    '{{ list 1 "a" 2.5 nil true }}', '{{ list }}', '{{ tuple 1 2 }}', '{{ join "," (list "a" "b" 1 nil) }}', '{{ join "-" .LIST.Value }}',
    '{{ join "," (splitList "," "x,y") }}', '{{ join "," nil }}', '{{ join "," 5 }}', '{{ sortAlpha (list "c" "a" "B") }}',
    '{{ sortAlpha "x" }}', '{{ sortAlpha (list 3 1 2) }}', '{{ split "," "a,b,c" }}', '{{ split "" "abc" }}', '{{ splitList "," "a,,b" }}',
    '{{ splitList "" "abc" }}', '{{ splitList "," "" }}', '{{ splitn "," 2 "a,b,c" }}', '{{ splitn "," 0 "a,b" }}', '{{ toStrings (list 1 "a" nil) }}',
    '{{ first (list 1 2 3) }}', '{{ first (list) }}', '{{ first "abc" }}', '{{ last (list 1 2 3) }}', '{{ rest (list 1 2 3) }}',
    '{{ rest (list) }}', '{{ initial (list 1 2 3) }}', '{{ append (list 1) 2 }}', '{{ push (list) "x" }}', '{{ prepend (list 1) 0 }}',
    '{{ append "x" 1 }}', '{{ reverse (list 1 2 3) }}', '{{ uniq (list 1 2 1 "a" "a" 1.0) }}', '{{ without (list 1 2 3 2) 2 }}',
    '{{ without (list 1 2 3) 1 3 }}', '{{ has 2 (list 1 2) }}', '{{ has "2" (list 1 2) }}', '{{ has 1 nil }}', '{{ has 1 "x" }}',
    '{{ compact (list 0 1 "" "a" nil false (list)) }}', '{{ slice (list 1 2 3 4) 1 3 }}', '{{ slice (list 1 2 3) 1 }}',
    '{{ slice (list 1 2 3) }}', '{{ slice (list) }}', '{{ slice (list 1 2) 3 }}', '{{ slice "abc" 1 }}', '{{ concat (list 1) (list 2 3) }}',
    '{{ concat }}', '{{ concat (list 1) "x" }}', '{{ chunk 2 (list 1 2 3 4 5) }}', '{{ chunk 3 (list) }}', '{{ chunk 2 (list 1 2) }}',
    '{{ mustFirst (list) }}', '{{ mustLast "x" }}', '{{ mustAppend (list 1) 2 }}', '{{ mustUniq (list 1 1) }}', '{{ mustHas 1 (list 1) }}',
    '{{ len (list 1 2 | append (list 0) ) }}',
    # dicts
    '{{ dict "a" 1 "b" "x" }}', '{{ dict }}', '{{ dict "a" }}', '{{ dict 1 2 }}', '{{ dict "a" 1 "a" 2 }}', '{{ get (dict "a" 1) "a" }}',
    '{{ get (dict "a" 1) "b" }}', '{{ $d := dict "a" 1 }}{{ $_ := set $d "b" 2 }}{{ $d }}', '{{ set (dict) "k" "v" }}',
    '{{ $d := dict "a" 1 "b" 2 }}{{ $_ := unset $d "a" }}{{ $d }}', '{{ hasKey (dict "a" 1) "a" }}', '{{ hasKey (dict "a" 1) "b" }}',
    '{{ pluck "a" (dict "a" 1) (dict "b" 2) (dict "a" 3) }}', '{{ keys (dict "b" 1) (dict "a" 2) | sortAlpha }}',
    '{{ keys }}', '{{ pick (dict "a" 1 "b" 2 "c" 3) "a" "c" "z" }}', '{{ omit (dict "a" 1 "b" 2 "c" 3) "a" "c" }}',
    '{{ values (dict "b" 2 "a" 1) | sortAlpha }}', '{{ merge (dict "a" 1 "n" (dict "x" 1)) (dict "a" 2 "b" 3 "n" (dict "x" 2 "y" 3)) }}',
    '{{ mergeOverwrite (dict "a" 1 "n" (dict "x" 1)) (dict "a" 2 "b" 3 "n" (dict "x" 2 "y" 3)) }}',
    '{{ merge (dict "a" "" "b" 0) (dict "a" "x" "b" 5) }}', '{{ mergeOverwrite (dict "a" "x") (dict "a" "") }}',
    '{{ $d := dict "a" 1 }}{{ $_ := merge $d (dict "b" 2) }}{{ $d }}', '{{ merge (dict "l" (list 1)) (dict "l" (list 2)) }}',
    '{{ mergeOverwrite (dict "l" (list 1)) (dict "l" (list 2)) }}', '{{ dig "a" "b" "def" (dict "a" (dict "b" "found")) }}',
    '{{ dig "a" "x" "def" (dict "a" (dict "b" "found")) }}', '{{ dig "a" "def" (dict) }}', '{{ dig "a" (dict) }}',
    '{{ dig "a" "b" "def" (dict "a" 1) }}', '{{ deepCopy (dict "a" (list 1 2)) }}', '{{ $a := dict "x" 1 }}{{ $b := deepCopy $a }}{{ $_ := set $b "y" 2 }}{{ $a }}{{ $b }}',
    '{{ get . "HOST" }}', '{{ set . "x" 1 }}', '{{ (dict "a" (list 1 2)).a }}', '{{ index (dict "a" nil) "a" }}', '{{ (dict "k" nil).k }}',
    # defaults
    '{{ default "d" "" }}', '{{ default "d" "v" }}', '{{ default "d" 0 }}', '{{ default "d" false }}', '{{ default "d" nil }}',
    '{{ default "d" (list) }}', '{{ default "d" (dict) }}', '{{ default "d" }}', '{{ "" | default "d" }}', '{{ .EMPTY.Value | default "fallback" }}',
    '{{ .HOST.Value | default "fallback" }}', '{{ default "d" .HOST }}', '{{ empty "" }}', '{{ empty 0 }}', '{{ empty 0.0 }}', '{{ empty "x" }}',
    '{{ empty (list) }}', '{{ empty nil }}', '{{ empty .HOST }}', '{{ coalesce "" 0 "x" "y" }}', '{{ coalesce "" 0 }}', '{{ coalesce }}',
    '{{ all 1 "a" (list 1) }}', '{{ all 1 "" }}', '{{ all }}', '{{ any 0 "" }}', '{{ any 0 "a" }}', '{{ any }}', '{{ ternary "y" "n" true }}',
    '{{ ternary "y" "n" false }}', '{{ true | ternary "y" "n" }}', '{{ ternary "y" "n" 1 }}', '{{ fail "boom" }}',
    # json
    '{{ toJson (dict "b" 1 "a" (list 1 "x" nil true 1.5)) }}', '{{ toJson "<&>" }}', '{{ toRawJson "<&>" }}', '{{ toJson nil }}',
    '{{ toJson 1e21 }}', '{{ toJson 1e-7 }}', '{{ toJson 0.1 }}', '{{ toJson 100.0 }}', '{{ toJson "tab\\tnl\\nq\\"\\u0001\\u2028" }}',
    '{{ toPrettyJson (dict "a" (list 1 2) "b" (dict) "c" (list)) }}', '{{ toPrettyJson (list) }}', '{{ toPrettyJson 1 }}',
    '{{ mustToJson (dict "a" 1) }}', '{{ mustToPrettyJson (list 1) }}', '{{ mustToRawJson (list "<") }}', '{{ toJson . }}',
    '{{ fromJson .JSON.Value }}', '{{ (fromJson .JSON.Value).a }}', '{{ (fromJson .JSON.Value).c.d }}', '{{ index (fromJson .JSON.Value) "b" 2 }}',
    '{{ printf "%T" (fromJson .JSON.Value).a }}', '{{ fromJson "[1, 2.5, \\"x\\"]" }}', '{{ fromJson "not json" }}', '{{ fromJson "" }}',
    '{{ fromJson "12345678901234567890" }}', '{{ fromJson "{\\"a\\":1,\\"a\\":2}" }}', '{{ mustFromJson "{}" }}', '{{ mustFromJson "nope" }}',
    '{{ fromJson "null" }}', '{{ .JSON.Value | fromJson | toJson }}', '{{ .JSON.Value | fromJson | toPrettyJson }}',
    '{{ (fromJson .JSON.Value).n }}', '{{ toJson (fromJson "1e400") }}',
    # reflection
    '{{ typeOf 1 }}', '{{ typeOf "x" }}', '{{ typeOf (list) }}', '{{ typeOf (dict) }}', '{{ typeOf nil }}', '{{ typeOf (splitList "," "a") }}',
    '{{ typeOf (split "," "a") }}', '{{ typeOf (add 1 1) }}', '{{ typeOf 1.5 }}', '{{ typeIs "int" 1 }}', '{{ typeIs "string" 1 }}',
    '{{ typeIsLike "int" 1 }}', '{{ kindOf 1 }}', '{{ kindOf (list) }}', '{{ kindOf (dict) }}', '{{ kindOf nil }}', '{{ kindOf "x" }}',
    '{{ kindIs "slice" (list) }}', '{{ kindIs "map" 1 }}', '{{ deepEqual (list 1 (dict "a" 1)) (list 1 (dict "a" 1)) }}',
    '{{ deepEqual 1 1.0 }}', '{{ deepEqual (add 1 1) 2 }}',
    # paths
    '{{ base "/a/b/c.txt" }}', '{{ base "" }}', '{{ base "/" }}', '{{ base "a/b/" }}', '{{ dir "/a/b/c" }}', '{{ dir "c" }}', '{{ dir "/" }}',
    '{{ clean "/a/../b/./c//" }}', '{{ clean "" }}', '{{ clean "../a/.." }}', '{{ ext "f.tar.gz" }}', '{{ ext "noext" }}', '{{ ext "a.b/c" }}',
    '{{ isAbs "/x" }}', '{{ isAbs "x" }}', '{{ osBase "/a/b" }}', '{{ osDir "/a/b" }}', '{{ osClean "a//b" }}', '{{ osExt "x.y" }}', '{{ osIsAbs "/" }}',
    # encoding
    '{{ b64enc "hello world" }}', '{{ b64enc "" }}', '{{ b64dec "aGVsbG8gd29ybGQ=" }}', '{{ b64dec .B64.Value }}', '{{ b64dec "aGVsbG8" }}',
    '{{ b64dec "!!!!" }}', '{{ b64dec "aGVs\\nbG8=" }}', '{{ b64dec "aGVsbA==" }}', '{{ b64dec "aGVsbA=" }}', '{{ b64dec "aGVsbA==x" }}',
    '{{ b64dec "a" }}', '{{ b64dec "" }}', '{{ .DB_PASSWORD.Value | b64enc | b64dec }}', '{{ b32enc "hello" }}', '{{ b32enc "hi" }}',
    '{{ b32enc "" }}', '{{ b32dec "NBSWY3DP" }}', '{{ b32dec "NBUQ====" }}', '{{ b32dec "!!" }}', '{{ b64enc 1 }}',
    # regex
    '{{ regexMatch "^[a-z]+$" "abc" }}', '{{ regexMatch "^[a-z]+$" "ab1" }}', '{{ regexMatch "(" "x" }}', '{{ mustRegexMatch "(" "x" }}',
    '{{ regexFind "[0-9]+" "ab123cd45" }}', '{{ regexFind "z" "abc" }}', '{{ regexFindAll "[0-9]+" "a1b22c333" -1 }}',
    '{{ regexFindAll "[0-9]+" "a1b22c333" 2 }}', '{{ regexFindAll "a*" "baaab" -1 }}', '{{ regexReplaceAll "a(x*)b" "-ab-axxb-" "${1}W" }}',
    '{{ regexReplaceAll "a(x*)b" "-ab-axxb-" "$1W" }}', '{{ regexReplaceAll "[0-9]" "a1b2" "#" }}', '{{ regexReplaceAll "x*" "abc" "-" }}',
    '{{ regexReplaceAllLiteral "a(x*)b" "-ab-axxb-" "${1}" }}', '{{ regexSplit "," "a,b,c" -1 }}', '{{ regexSplit "," "a,b,c" 2 }}',
    '{{ regexSplit "x*" "axbxxc" -1 }}', '{{ regexSplit "" "abc" -1 }}', '{{ regexSplit "," "" -1 }}', '{{ regexQuoteMeta "a.b*c" }}',
    '{{ regexFind "(?i)HELLO" "say hello" }}', '{{ regexReplaceAll "(?P<first>\\\\w+) (?P<second>\\\\w+)" "hello world" "${second} ${first}" }}',
    '{{ regexFind "(" "x" }}', '{{ mustRegexFind "[" "x" }}', '{{ .HOST.Value | regexReplaceAll "\\\\." "_" }}',
    # misc
    '{{ hello }}', '{{ "x" | hello }}',
]
for t in S:
    add("sprig/" + t, t)

# 10. Combined templates, as users write them.
for t in [
    "postgres://{{ .DB_USER.Value }}:{{ .DB_PASSWORD.Value | urlquery }}@{{ .HOST.Value }}:{{ .PORT.Value }}/app",
    "{{- range $k, $v := . }}\n{{ $k }}={{ $v.Value | quote }}\n{{- end }}",
    "config:\n  host: {{ .HOST.Value | quote }}\n  port: {{ .PORT.Value | atoi }}\n  tags:{{ range splitList \",\" .LIST.Value }}\n    - {{ . }}{{ end }}",
    "{{ $c := .JSON.Value | fromJson }}{{ range $i, $x := $c.b }}{{ if $i }}|{{ end }}{{ $x }}{{ end }}",
    "{{ dict \"user\" .DB_USER.Value \"pass\" .DB_PASSWORD.Value | toJson | b64enc }}",
    "{{ if and (hasPrefix \"db\" .HOST.Value) (gt (atoi .PORT.Value) 1024) }}ok{{ end }}",
    "{{ .MULTI.Value | splitList \"\\n\" | join \";\" }}",
    "{{- with $p := .PORT.Value }}port={{ $p }}{{ end -}}",
    "{{ printf \"%s:%s\" .DB_USER.Value .DB_PASSWORD.Value | b64enc }}",
    "{{ $list := list }}{{ range $k, $_ := . }}{{ $list = append $list $k }}{{ end }}{{ $list | join \",\" }}",
    "{{ range $i := until 3 }}{{ printf \"item-%02d\\n\" $i }}{{ end }}",
    "[{{ range $i, $k := keys (dict \"z\" 1 \"y\" 2) | sortAlpha }}{{ if $i }}, {{ end }}{{ $k | quote }}{{ end }}]",
    "{{ .HTML.Value }}|{{ .HTML.Value | html }}|{{ toJson .HTML.Value }}",
    "{{ .UNICODE.Value | upper }} {{ len .UNICODE.Value }} {{ .UNICODE.Value | title }}",
    "{{ (.FLOAT.Value | float64) }} {{ mulf (.FLOAT.Value | float64) 2 }} {{ .NUM.Value | int | mul 2 }}",
    "{{ if eq .BOOL.Value \"true\" }}on{{ end }}",
    "{{ $parts := split \".\" .HOST.Value }}{{ $parts._0 }}",
    "{{ .YAMLISH.Value | replace \": \" \"=\" }}",
]:
    add("combined/" + t, t)

# 10b. More edge cases of the language.
for t in [
    "a \r\n{{- \"b\" -}}\r\n c", "{{ \"x\" }}\r\n", "{{- /* c */ -}}\r\n\r\nx", "{{ \"\\q\" }}", "{{ \"a\nb\" }}",
    "{{ .Ключ.Value }}", "{{ range $k, $v := . }}{{ range $.HOST.Value | splitList \".\" }}{{ $k | trunc 2 }}{{ . | trunc 1 }}{{ end }}{{ end }}",
    "{{ .HOST.Value | printf \"%s\" | len }}", "{{ printf \"%5v|%-5v|\" (list 1 2) \"ab\" }}", "{{ printf \"%v\" (dict \"a\" nil \"b\" (list nil)) }}",
    "{{ printf \"%08.3f|%+.2e|%x|%X\" 3.14159 12345.678 255 \"Zz\" }}", "{{ printf \"%t %v\" false (not true) }}",
    "{{ printf \"%c%c%c\" 72 105 0x1F600 }}", "{{ printf \"%U\" 0x1F600 }}", "{{ printf \"%#U\" 'x' }}", "{{ printf \"%q\" 0x1F600 }}",
    "{{ printf \"%6.2f%%\" 12.3456 }}", "{{ printf \"%-8s|%8s|\" \"left\" \"right\" }}", "{{ printf \"%03d:%02d\" 7 5 }}",
    "{{ $x := 1 }}{{ with $x }}{{ $x := 2 }}{{ $x }}{{ end }}{{ $x }}", "{{ $x := 1 }}{{ range list 1 }}{{ $x = 5 }}{{ end }}{{ $x }}",
    "{{ range $i, $v := list \"a\" }}{{ $i }}{{ end }}{{ $i }}", "{{ with $v := \"x\" }}{{ end }}{{ $v }}",
    "{{ define \"inner\" }}{{ .Value }}@{{ .SecretPath }}{{ end }}{{ template \"inner\" .HOST }}",
    "{{ define \"list\" }}{{ range . }}[{{ . }}]{{ end }}{{ end }}{{ template \"list\" (list 1 2) }}",
    "{{ if and .HOST.Value (not .EMPTY.Value) }}y{{ end }}", "{{ if or .EMPTY.Value .PORT.Value }}{{ .PORT.Value }}{{ end }}",
    "{{ if ne .PORT.Value \"5432\" }}no{{ else }}yes{{ end }}", "{{ if gt (len .LIST.Value) 3 }}long{{ end }}",
    "{{ $m := dict }}{{ range $k, $v := . }}{{ if hasPrefix \"DB_\" $k }}{{ $_ := set $m $k $v.Value }}{{ end }}{{ end }}{{ toJson $m }}",
    "{{ $out := \"\" }}{{ range splitList \",\" .LIST.Value }}{{ $out = printf \"%s%s;\" $out . }}{{ end }}{{ $out }}",
    "{{ range $i, $c := .UNICODE.Value | splitList \"\" }}{{ $i }}{{ end }}", "{{ index .HOST.Value 0 }}", "{{ printf \"%c\" (index .HOST.Value 0) }}",
    "{{ slice .HOST.Value 0 2 }}", "{{ .JSON.Value | fromJson | dig \"c\" \"d\" \"none\" }}", "{{ dig \"c\" \"d\" \"none\" (.JSON.Value | fromJson) }}",
    "{{ (fromJson .JSON.Value).b | toJson }}", "{{ range (fromJson .JSON.Value).b }}{{ kindOf . }},{{ end }}",
    "{{ 1 }}{{/* */}}{{ 2 }}", "{{ \"a\" }}{{- /* trimmed both */ -}}  {{ \"b\" }}",
]:
    add("edge/" + t, t)

# 11. Generated: functions over a range of inputs.
def q(text):
    return json.dumps(text, ensure_ascii=False)


STRING_INPUTS = ["", "abc", "Hello World", "  x  ", "héllo wörld", "ß straße", "a,b,,c", "1.50", "0x1F", "-12",
                 "/a/b/../c.txt", "line1\nline2", "<tag attr='v'>&amp;", "tab\there", "日本語テキスト", "ǆemal",
                 "\u00a0nbsp\u2003em", '{"k":[1,2],"z":null}', "aGk=", "NBSWY3DP", "İstanbul", "ﬁ ligature", "\u2028sep",
                 "x\u0001y", "a\\b\"c'd", "CamelCase_snake-kebab", "   ", "1e3", "true", "010"]
STRING_FUNCS = ["trim", "upper", "lower", "title", "untitle", "nospace", "initials", "swapcase", "quote", "squote",
                "b64enc", "b32enc", "sha1sum", "sha256sum", "adler32sum", "toString", "len", "base", "dir", "clean",
                "ext", "isAbs", "regexQuoteMeta", "html", "js", "urlquery", "atoi", "int", "int64", "float64", "toJson",
                "toRawJson", "fromJson", "b64dec", "b32dec", "trunc 3", "trunc -3", "abbrev 5", "repeat 2", "indent 2",
                "nindent 1", "substr 1 3", "splitList \",\"", "split \",\"", "toStrings", "sortAlpha", "empty",
                "default \"d\"", "kindOf", "typeOf", "trimAll \" a\"", "trimPrefix \"a\"", "trimSuffix \"c\"",
                "contains \"b\"", "hasPrefix \"H\"", "hasSuffix \"d\"", "replace \"l\" \"L\"", "printf \"[%q]\"",
                "printf \"[%x]\"", "printf \"[%5.2s]\"", "print", "println", "regexFind \"[a-z]+\"",
                "regexFindAll \"[a-z]\" 2", "regexReplaceAll \"[aeiou]\" \"_\"", "regexSplit \"[, ]\" -1",
                "regexMatch \"^[a-z]*$\"", "plural \"one\"", "list", "ternary \"y\" \"n\""]
for f in STRING_FUNCS:
    for text in STRING_INPUTS:
        add(f"gen/{f} {text}", f"{{{{ {q(text)} | {f} }}}}")

NUMBER_INPUTS = ["0", "1", "-1", "1.5", "-2.5", "1e6", "1e21", "0.1", "\"3\"", "\"3.0\"", "\"x\"", "true", "nil",
                 "9223372036854775807", "0.000001", "123456789.123", "(add 2 3)", "(len \"abcd\")", "'z'", "0x10"]
NUMBER_FUNCS = ["add1", "int", "int64", "float64", "toString", "ceil", "floor", "printf \"%v\"", "printf \"%d\"",
                "printf \"%.3f\"", "printf \"%g\"", "printf \"%s\"", "toJson", "add 1", "sub 1", "mul 2", "div 10",
                "mod 3", "addf 0.1", "subf 0.1", "mulf 3", "divf 3", "max 0", "min 0", "maxf 0", "minf 0", "round 2",
                "add1f", "toDecimal", "empty", "default 7", "kindOf", "typeOf", "print", "quote", "seq", "until",
                "eq 1", "lt 1", "not", "len", "list", "biggest 2"]
for f in NUMBER_FUNCS:
    for n in NUMBER_INPUTS:
        if f in ("seq", "until") and n == "9223372036854775807":
            continue  # Go would build a list of 2^63 items
        add(f"gen/{f} {n}", f"{{{{ {n} | {f} }}}}")

LIST_INPUTS = ["(list)", "(list 1)", "(list 1 2 3)", "(list \"b\" \"a\" \"b\")", "(list nil 1 \"\")",
               "(splitList \",\" \"x,y\")", "(until 3)", "(list (list 1) (dict \"a\" 1))", "(list 1.5 true \"s\")",
               "(dict \"k\" 1 \"j\" (list 2))", "\"str\"", "nil"]
LIST_FUNCS = ["first", "last", "rest", "initial", "reverse", "uniq", "compact", "len", "toJson", "toPrettyJson",
              "sortAlpha", "join \",\"", "has 1", "without 1", "append 9", "prepend 0", "slice 1", "chunk 2",
              "toStrings", "empty", "concat (list 9)", "printf \"%v\"", "printf \"%q\"", "printf \"%d\"", "print",
              "quote", "deepCopy", "kindOf", "typeOf", "index 0", "keys", "values", "pick \"k\"", "omit \"k\"",
              "hasKey \"k\"", "get \"k\"", "toString", "default (list 0)", "mustFirst", "cat 1", "len | add 1"]
for f in LIST_FUNCS:
    for l in LIST_INPUTS:
        if f == "keys" and l.startswith("(dict"):
            continue  # Go iterates maps in random order
        if f == "values" and l.startswith("(dict"):
            continue
        add(f"gen/{f} {l}", f"{{{{ {l} | {f} }}}}")

# 12. Functions refused on purpose.
for f, reason in [
    ("randAlphaNum 5", NONDET), ("randAlpha 5", NONDET), ("randAscii 5", NONDET), ("randNumeric 5", NONDET), ("randBytes 5", NONDET),
    ("randInt 1 5", NONDET), ("uuidv4", NONDET), ("now", NONDET), ("ago now", NONDET), ("shuffle \"abc\"", NONDET),
    ("genPrivateKey \"rsa\"", NONDET), ("genCA \"ca\" 365", NONDET), ("bcrypt \"x\"", NONDET), ("htpasswd \"u\" \"p\"", NONDET),
    ("encryptAES \"k\" \"x\"", NONDET), ("getHostByName \"localhost\"", ENV),
    ("date \"2006\" 0", UNIMPL), ("toDate \"2006-01-02\" \"2024-01-01\"", UNIMPL), ("duration 95", UNIMPL), ("unixEpoch 0", UNIMPL),
    ("snakecase \"HelloWorld\"", UNIMPL), ("camelcase \"hello_world\"", UNIMPL), ("kebabcase \"HelloWorld\"", UNIMPL),
    ("wrap 5 \"hello world\"", UNIMPL), ("wrapWith 5 \"\\n\" \"hello world\"", UNIMPL), ("semver \"1.2.3\"", UNIMPL),
    ("semverCompare \">1.0\" \"1.2.3\"", UNIMPL), ("urlParse \"http://x\"", UNIMPL), ("urlJoin (dict)", UNIMPL),
    ("derivePassword 1 \"long\" \"p\" \"u\" \"s\"", UNIMPL), ("decryptAES \"k\" \"x\"", UNIMPL),
]:
    add(f"refused/{f}", f"{{{{ {f} }}}}", deliberate=reason)

print(json.dumps({"data": DATA, "cases": cases}, indent=1, ensure_ascii=False))
