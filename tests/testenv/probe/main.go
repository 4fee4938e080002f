// Command probe is the node suite's workload for gradual reload: an
// application that runs until it is stopped and reports itself ready only
// when its configuration is good.
//
//	probe        run until SIGTERM or SIGINT
//	probe ready  exit 0 when VALUE is good, 1 when it starts with "bad"
//	             (the container's readiness probe)
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "ready" {
		if value := os.Getenv("VALUE"); strings.HasPrefix(value, "bad") {
			fmt.Fprintln(os.Stderr, "probe: VALUE is bad")
			os.Exit(1)
		}
		return
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	<-stop
}
