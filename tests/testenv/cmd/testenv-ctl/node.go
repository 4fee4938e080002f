package main

// One real node beside the control plane: containerd (Debian's) with runc,
// kube-controller-manager, kube-scheduler, kube-proxy and a kubelet, with
// the CNI bridge plugins, so that pods run, probes are called, rollouts
// happen and the garbage collector deletes dependents.
//
// The node is host-wide (the kubelet's ports, the cni0 bridge, iptables
// chains, sysctls), so one machine runs one: a marker file names the
// directory that has it. Everything changed on the host is recorded in
// DIR/node/host.json and undone by down.
//
// Pod traffic never leaves the machine: the bridge does no masquerading,
// the chain KMS-TESTENV-FWD (first in the mangle table's FORWARD) drops
// forwarded traffic from the pod range that would leave through anything
// but cni0 or loopback, and KMS-TESTENV-OUT (first in POSTROUTING, which
// host traffic passes after kube-proxy's Service rewrite) drops traffic to
// the pod range that is not on cni0, to the Service range that no
// kube-proxy rule rewrote, and from the pod range off the bridge. Both are
// in place before containerd starts.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

const (
	// podCIDR is the range of the CNI bridge.
	podCIDR = "10.88.0.0/16"
	// serviceCIDR is the apiserver's Service range.
	serviceCIDR = "10.0.0.0/24"
	// dnsIP is the ClusterIP of cluster DNS.
	dnsIP = "10.0.0.10"
	// nodeMarker names the directory whose node runs on this machine.
	nodeMarker = "/run/kms-testenv-node"
	// fwdChain and outChain are the guard chains.
	fwdChain = "KMS-TESTENV-FWD"
	outChain = "KMS-TESTENV-OUT"
	// pauseImage is the sandbox image, imported, never pulled.
	pauseImage = "localhost/pause:3.10"
)

// nodeComponents are the node's processes, in start order: the image
// registry its containerd pulls from (Debian's docker-registry, plain HTTP
// on loopback), containerd, the control loops, the kubelet.
var nodeComponents = []string{"registry", "containerd", "controller-manager", "scheduler", "kube-proxy", "kubelet"}

// hostChanges is what up changed on the host, for down to undo.
type hostChanges struct {
	// Sysctls and their values before up.
	Sysctls map[string]string `json:"sysctls"`
	// Chains created in the filter table.
	Chains []string `json:"chains"`
}

// Sysctls the node's components change (the kubelet, kube-proxy) or up
// sets (forwarding, bridge netfilter), restored by down.
var watchedSysctls = []string{
	"net/ipv4/ip_forward",
	"net/bridge/bridge-nf-call-iptables",
	"net/ipv4/conf/all/route_localnet",
	"vm/overcommit_memory",
	"kernel/panic",
	"kernel/panic_on_oops",
	"net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait",
	"net/netfilter/nf_conntrack_max",
}

func nodeDir(dir string) string { return filepath.Join(dir, "node") }

func socketPath(dir string) string { return filepath.Join(nodeDir(dir), "containerd.sock") }

// nodeIP is the address the machine would use to reach the outside: the
// node's InternalIP and the apiserver's advertised address. No packet is
// sent (a UDP "connection" only picks a route).
func nodeIP() (string, error) {
	c, err := net.Dial("udp", "10.255.255.254:9")
	if err != nil {
		return "", fmt.Errorf("finding the node's address: %w", err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// claimNode records dir as the machine's node, refusing when another
// directory's node still runs.
func claimNode(dir string) error {
	b, err := os.ReadFile(nodeMarker)
	if err == nil {
		other := strings.TrimSpace(string(b))
		if other != dir {
			if _, ok := running(other, "kubelet"); ok {
				return fmt.Errorf("a node already runs on this machine for %s (the kubelet's ports, cni0 and "+
					"its iptables chains are host-wide); stop it first with: testenv down %s", other, other)
			}
			if _, ok := running(other, "containerd"); ok {
				return fmt.Errorf("a node is set up on this machine for %s; stop it first with: testenv down %s", other, other)
			}
			// Nothing of the other node runs: its run was killed before
			// `testenv down`, and its mounts, links and chains would stay
			// beside this node's.
			if _, err := os.Stat(nodeDir(other)); err == nil {
				fmt.Fprintf(os.Stderr, "testenv: undoing what the stopped node of %s left on the host\n", other)
				if err := nodeDown(other); err != nil {
					return fmt.Errorf("undoing the stopped node of %s: %w", other, err)
				}
			}
		}
	}
	return os.WriteFile(nodeMarker, []byte(dir+"\n"), 0o644)
}

func readSysctl(name string) (string, bool) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", name))
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

func writeSysctl(name, value string) error {
	return os.WriteFile(filepath.Join("/proc/sys", name), []byte(value+"\n"), 0o644)
}

func iptables(args ...string) error {
	out, err := exec.Command("iptables", append([]string{"-w", "5"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// guardHooks are the built-in chains of the mangle table the guard chains
// hang from, first in each. kube-proxy and the kubelet put their own rules
// first in the filter and nat tables, never in mangle, so these stay first.
var guardHooks = [][2]string{{"FORWARD", fwdChain}, {"POSTROUTING", outChain}}

// guard installs the chains that keep pod traffic on the machine, in the
// mangle table (after routing, so the outgoing interface is known, and for
// host traffic after kube-proxy's Service rewrite).
func guard() error {
	for _, c := range []string{fwdChain, outChain} {
		_ = iptables("-t", "mangle", "-F", c)
		if err := iptables("-t", "mangle", "-N", c); err != nil && !strings.Contains(err.Error(), "exists") {
			return err
		}
	}
	rules := [][]string{
		// Forwarded: pod traffic stays between pods and the node.
		{fwdChain, "-s", podCIDR, "-o", "cni0", "-j", "RETURN"},
		{fwdChain, "-s", podCIDR, "-o", "lo", "-j", "RETURN"},
		{fwdChain, "-s", podCIDR, "-j", "DROP"},
		{fwdChain, "-d", podCIDR, "!", "-o", "cni0", "-j", "DROP"},
		// Leaving the host: pods are reached only through cni0, and a
		// Service address that no kube-proxy rule rewrote goes nowhere.
		{outChain, "-d", podCIDR, "!", "-o", "cni0", "-j", "DROP"},
		{outChain, "-d", serviceCIDR, "-j", "DROP"},
		{outChain, "-s", podCIDR, "-o", "cni0", "-j", "RETURN"},
		{outChain, "-s", podCIDR, "-o", "lo", "-j", "RETURN"},
		{outChain, "-s", podCIDR, "-j", "DROP"},
	}
	for _, r := range rules {
		if err := iptables(append([]string{"-t", "mangle", "-A"}, r...)...); err != nil {
			return err
		}
	}
	for _, hook := range guardHooks {
		if exec.Command("iptables", "-w", "5", "-t", "mangle", "-C", hook[0], "-j", hook[1]).Run() != nil {
			if err := iptables("-t", "mangle", "-I", hook[0], "1", "-j", hook[1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// prepareHost records and sets what the node needs on the host, and the
// guard chains, before any node process starts.
func prepareHost(dir string) error {
	if err := os.MkdirAll(nodeDir(dir), 0o755); err != nil {
		return err
	}
	path := filepath.Join(nodeDir(dir), "host.json")
	var changes hostChanges
	if b, err := os.ReadFile(path); err == nil {
		// Resumed: the values recorded first are the ones to restore.
		if err := json.Unmarshal(b, &changes); err != nil {
			return err
		}
	} else {
		changes.Sysctls = map[string]string{}
		for _, s := range watchedSysctls {
			if v, ok := readSysctl(s); ok {
				changes.Sysctls[s] = v
			}
		}
		changes.Chains = []string{fwdChain, outChain}
		if err := writeJSON(path, changes); err != nil {
			return err
		}
	}
	if err := guard(); err != nil {
		return err
	}
	for _, s := range []string{"net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"} {
		if err := writeSysctl(s, "1"); err != nil {
			return fmt.Errorf("sysctl %s: %w", s, err)
		}
	}
	return nil
}

func writeNodeConfigs(dir, bin, ip string, st state) error {
	nd := nodeDir(dir)
	for _, d := range []string{"containerd", "cni", "cni-ipam", "kubelet", "kubelet-pki", "manifests"} {
		if err := os.MkdirAll(filepath.Join(nd, d), 0o755); err != nil {
			return err
		}
	}
	containerd := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %q
`, filepath.Join(nd, "containerd", "root"), filepath.Join(nd, "containerd", "state"), socketPath(dir),
		pauseImage, filepath.Join(bin, "cni"), filepath.Join(nd, "cni"), filepath.Join(nd, "certs.d"))
	if err := os.WriteFile(filepath.Join(nd, "containerd.toml"), []byte(containerd), 0o644); err != nil {
		return err
	}
	if err := writeRegistryConfigs(nd, st.RegistryPort); err != nil {
		return err
	}
	cni := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "testenv",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": podCIDR}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": filepath.Join(nd, "cni-ipam"),
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	if err := writeJSON(filepath.Join(nd, "cni", "10-testenv.conflist"), cni); err != nil {
		return err
	}
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
clusterDNS: [%s]
clusterDomain: cluster.local
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
serializeImagePulls: false
staticPodPath: %s
`, socketPath(dir), dnsIP, filepath.Join(nd, "manifests"))
	if err := os.WriteFile(filepath.Join(nd, "kubelet.yaml"), []byte(kubelet), 0o644); err != nil {
		return err
	}
	proxy := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
`, filepath.Join(dir, "kubeconfig"), podCIDR, nodeName())
	return os.WriteFile(filepath.Join(nd, "kube-proxy.yaml"), []byte(proxy), 0o644)
}

// nodeName is the machine's host name, which the node registers as (the
// apiserver dials it for logs and exec, so it must resolve).
func nodeName() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "localhost"
	}
	return strings.ToLower(h)
}

// writeRegistryConfigs writes the registry's configuration (storage under
// the node's directory, plain HTTP on the loopback port) and the hosts.toml
// through which containerd pulls from it over plain HTTP.
func writeRegistryConfigs(nd string, port int) error {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	registry := fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, filepath.Join(nd, "registry-data"), addr)
	if err := os.WriteFile(filepath.Join(nd, "registry.yml"), []byte(registry), 0o644); err != nil {
		return err
	}
	hostsDir := filepath.Join(nd, "certs.d", addr)
	if err := os.MkdirAll(hostsDir, 0o755); err != nil {
		return err
	}
	hosts := fmt.Sprintf(`server = "http://%s"

[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, addr, addr)
	return os.WriteFile(filepath.Join(hostsDir, "hosts.toml"), []byte(hosts), 0o644)
}

func nodeArgs(dir, bin, ip, component string) []string {
	nd := nodeDir(dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	pki := filepath.Join(dir, "pki")
	switch component {
	case "registry":
		return []string{"docker-registry", "serve", filepath.Join(nd, "registry.yml")}
	case "containerd":
		return []string{"containerd", "--config", filepath.Join(nd, "containerd.toml"), "--log-level", "warn"}
	case "controller-manager":
		return []string{
			filepath.Join(bin, "kube-controller-manager"),
			"--kubeconfig=" + kubeconfig,
			"--service-account-private-key-file=" + filepath.Join(pki, "sa.key"),
			"--root-ca-file=" + filepath.Join(pki, "ca.crt"),
			"--use-service-account-credentials=true",
			"--leader-elect=false",
			"--secure-port=0",
			"--controllers=*",
			"--cluster-name=" + filepath.Base(dir),
			"--v=1",
		}
	case "scheduler":
		return []string{filepath.Join(bin, "kube-scheduler"), "--kubeconfig=" + kubeconfig,
			"--leader-elect=false", "--secure-port=0", "--v=1"}
	case "kube-proxy":
		return []string{filepath.Join(bin, "kube-proxy"), "--config=" + filepath.Join(nd, "kube-proxy.yaml"), "--v=1"}
	case "kubelet":
		return []string{
			filepath.Join(bin, "kubelet"),
			"--config=" + filepath.Join(nd, "kubelet.yaml"),
			"--kubeconfig=" + kubeconfig,
			"--node-ip=" + ip,
			"--root-dir=" + filepath.Join(nd, "kubelet"),
			"--cert-dir=" + filepath.Join(nd, "kubelet-pki"),
			"--v=1",
		}
	}
	panic("unknown node component " + component)
}

// nodeUp starts the node's processes that do not run, imports the images
// of bin/images, and waits until the node is Ready.
func nodeUp(dir, bin string, st state, deadline time.Time) error {
	if err := claimNode(dir); err != nil {
		return err
	}
	if err := prepareHost(dir); err != nil {
		return err
	}
	if err := writeNodeConfigs(dir, bin, st.NodeIP, st); err != nil {
		return err
	}
	for _, c := range nodeComponents {
		if _, ok := running(dir, c); ok {
			continue
		}
		if err := start(dir, c, nodeArgs(dir, bin, st.NodeIP, c)); err != nil {
			return err
		}
		if c == "registry" {
			if err := waitRegistry(dir, st.RegistryPort, deadline); err != nil {
				return err
			}
		}
		if c == "containerd" {
			if err := waitContainerd(dir, deadline); err != nil {
				return err
			}
			if err := importImages(dir, filepath.Join(bin, "images")); err != nil {
				return err
			}
		}
	}
	return waitNodeReady(dir, st, deadline)
}

func ctrCmd(dir string, args ...string) *exec.Cmd {
	return exec.Command("ctr", append([]string{"-a", socketPath(dir), "-n", "k8s.io"}, args...)...)
}

// waitRegistry waits until the registry answers its API's base route.
func waitRegistry(dir string, port int, deadline time.Time) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/v2/", port)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !alive(dir, "registry") {
			return fmt.Errorf("the registry exited; see %s", filepath.Join(dir, "logs", "registry.log"))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the registry did not answer in time; see %s", filepath.Join(dir, "logs", "registry.log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func waitContainerd(dir string, deadline time.Time) error {
	for {
		if ctrCmd(dir, "version").Run() == nil {
			return nil
		}
		if !alive(dir, "containerd") {
			return fmt.Errorf("containerd exited; see %s", filepath.Join(dir, "logs", "containerd.log"))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd not ready in time; see %s", filepath.Join(dir, "logs", "containerd.log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// importImages imports every tarball of imagesDir into the node.
func importImages(dir, imagesDir string) error {
	entries, err := os.ReadDir(imagesDir)
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".tar") {
			continue
		}
		if err := importImage(dir, filepath.Join(imagesDir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func importImage(dir, tarball string) error {
	out, err := ctrCmd(dir, "images", "import", "--no-unpack=false", tarball).CombinedOutput()
	if err != nil {
		return fmt.Errorf("importing %s: %v: %s", tarball, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func waitNodeReady(dir string, st state, deadline time.Time) error {
	client, base, err := apiClient(dir, st)
	if err != nil {
		return err
	}
	url := base + "/api/v1/nodes/" + nodeName()
	for {
		resp, err := client.Get(url)
		if err == nil {
			var node struct {
				Status struct {
					Conditions []struct{ Type, Status string } `json:"conditions"`
				} `json:"status"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&node)
			resp.Body.Close()
			for _, c := range node.Status.Conditions {
				if c.Type == "Ready" && c.Status == "True" {
					return nil
				}
			}
		}
		for _, c := range nodeComponents {
			if !alive(dir, c) {
				return fmt.Errorf("%s exited; see %s", c, filepath.Join(dir, "logs", c+".log"))
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s not Ready in time; see %s", nodeName(), filepath.Join(dir, "logs", "kubelet.log"))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// nodeDown stops the node and undoes every host change: containers and
// their shims, mounts under the kubelet's directory, the cni0 link and the
// pods' network namespaces, the guard and kube-proxy chains, the kubepods
// cgroups, and the sysctls.
func nodeDown(dir string) error {
	var errs []error
	nd := nodeDir(dir)
	if _, err := os.Stat(nd); err != nil {
		return nil
	}
	for _, c := range []string{"kubelet", "kube-proxy", "scheduler", "controller-manager"} {
		if err := stop(dir, c); err != nil {
			errs = append(errs, err)
		}
	}
	// Containers: kill every task while containerd still answers, then
	// stop containerd and whatever shim is left.
	if _, ok := running(dir, "containerd"); ok {
		if out, err := ctrCmd(dir, "tasks", "ls", "-q").Output(); err == nil {
			for _, id := range strings.Fields(string(out)) {
				_ = ctrCmd(dir, "tasks", "kill", "-s", "SIGKILL", id).Run()
			}
			time.Sleep(500 * time.Millisecond)
			for _, id := range strings.Fields(string(out)) {
				_ = ctrCmd(dir, "tasks", "delete", "-f", id).Run()
			}
		}
	}
	if err := stop(dir, "containerd"); err != nil {
		errs = append(errs, err)
	}
	if err := stop(dir, "registry"); err != nil {
		errs = append(errs, err)
	}
	killShims(dir)
	unmountUnder(nd)
	_ = exec.Command("ip", "link", "delete", "cni0").Run()
	removeNetns()
	// kube-proxy's chains, then ours.
	if bin := recordedBin(dir, "kube-proxy"); bin != "" {
		_ = exec.Command(bin, "--cleanup").Run()
	}
	for _, hook := range guardHooks {
		for exec.Command("iptables", "-w", "5", "-t", "mangle", "-D", hook[0], "-j", hook[1]).Run() == nil {
		}
	}
	for _, c := range []string{fwdChain, outChain} {
		_ = iptables("-t", "mangle", "-F", c)
		_ = iptables("-t", "mangle", "-X", c)
	}
	removeKubeChains()
	removeCgroups()
	var changes hostChanges
	if b, err := os.ReadFile(filepath.Join(nd, "host.json")); err == nil && json.Unmarshal(b, &changes) == nil {
		names := make([]string, 0, len(changes.Sysctls))
		for n := range changes.Sysctls {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			if v, ok := readSysctl(n); ok && v != changes.Sysctls[n] {
				if err := writeSysctl(n, changes.Sysctls[n]); err != nil {
					errs = append(errs, fmt.Errorf("restoring %s: %w", n, err))
				}
			}
		}
		_ = os.Remove(filepath.Join(nd, "host.json"))
	}
	if b, err := os.ReadFile(nodeMarker); err == nil && strings.TrimSpace(string(b)) == dir {
		_ = os.Remove(nodeMarker)
	}
	return errors.Join(errs...)
}

// recordedBin is the binary a component was started with, from its args.
func recordedBin(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name+".args"))
	if err != nil {
		return ""
	}
	return strings.SplitN(string(b), "\n", 2)[0]
}

// killShims kills the containerd shims started for dir's containerd, and
// the container processes under them.
func killShims(dir string) {
	sock := socketPath(dir)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(cmdline), "containerd-shim") && strings.Contains(string(cmdline), sock) {
			// The shim's children (the containers) go first.
			if children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)); err == nil {
				for _, c := range strings.Fields(string(children)) {
					var cpid int
					if _, err := fmt.Sscanf(c, "%d", &cpid); err == nil {
						_ = syscall.Kill(cpid, syscall.SIGKILL)
					}
				}
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// unmountUnder unmounts every mount point below root, deepest first.
func unmountUnder(root string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 {
			p := unescapeMount(fields[4])
			if p == root || strings.HasPrefix(p, root+"/") {
				points = append(points, p)
			}
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		if err := syscall.Unmount(p, 0); err != nil {
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
		}
	}
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// removeNetns deletes the network namespaces the CNI plugins made for pods.
func removeNetns() {
	entries, _ := os.ReadDir("/var/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "cni-") {
			_ = exec.Command("ip", "netns", "delete", e.Name()).Run()
		}
	}
}

// removeKubeChains removes chains kube-proxy or the kubelet left (KUBE-*),
// in every table, with the jumps to them.
func removeKubeChains() {
	for _, table := range []string{"filter", "nat", "mangle"} {
		out, err := exec.Command("iptables-save", "-t", table).Output()
		if err != nil {
			continue
		}
		var chains []string
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "-A ") && strings.Contains(line, " -j KUBE-") {
				rule := strings.Fields(strings.TrimPrefix(line, "-A "))
				if len(rule) > 0 && !strings.HasPrefix(rule[0], "KUBE-") {
					_ = exec.Command("iptables", append([]string{"-w", "5", "-t", table, "-D"}, rule...)...).Run()
				}
			}
			if strings.HasPrefix(line, ":KUBE-") {
				chains = append(chains, strings.Fields(line[1:])[0])
			}
		}
		for _, c := range chains {
			_ = exec.Command("iptables", "-w", "5", "-t", table, "-F", c).Run()
		}
		for _, c := range chains {
			_ = exec.Command("iptables", "-w", "5", "-t", table, "-X", c).Run()
		}
	}
}

// removeCgroups removes the kubepods cgroups (deepest first) of every
// controller.
func removeCgroups() {
	var dirs []string
	_ = filepath.Walk("/sys/fs/cgroup", func(path string, info os.FileInfo, err error) error {
		if err != nil || !info.IsDir() {
			return nil
		}
		if strings.Contains(path, "kubepods") {
			dirs = append(dirs, path)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		_ = syscall.Rmdir(d)
	}
}
