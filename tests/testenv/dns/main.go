// Command coredns is CoreDNS with the plugins cluster DNS of a testenv node
// needs and no others (no forward: nothing is resolved outside the
// cluster), built from the CoreDNS module the way its docs describe for a
// custom set of plugins.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// The plugins, in the order CoreDNS's own plugin.cfg chains them.
var directives = []string{"reload", "health", "ready", "errors", "cache", "loop", "kubernetes"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
