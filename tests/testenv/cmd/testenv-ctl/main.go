// Command testenv-ctl starts, stops and restarts a local control plane
// (etcd + kube-apiserver) for kms-operator's tests. It uses only the standard
// library so it builds in seconds; the `testenv` script builds the Kubernetes
// binaries and calls it.
//
//	testenv-ctl up      -dir DIR -bin BINDIR [-node]  start (or resume) and wait until ready
//	testenv-ctl down    -dir DIR               stop everything started for DIR
//	testenv-ctl restart -dir DIR -bin BINDIR -component etcd|apiserver
//	testenv-ctl status  -dir DIR               print which components run
//	testenv-ctl image   -root DIR -tag T -out FILE [-entrypoint J] [-cmd J] [-user U] [-expose P,...]
//	testenv-ctl import  -dir DIR -image FILE   import an image tarball into DIR's node
//
// State kept in DIR: pki/ (certificates), etcd/ (data), logs/, state.json
// (ports, whether it has a node), <component>.pid and <component>.args (one
// argument per line, so a chaos test can kill -9 a component and start the
// same command again), node/ (see node.go).
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type state struct {
	EtcdPort int `json:"etcdPort"`
	PeerPort int `json:"peerPort"`
	APIPort  int `json:"apiPort"`
	// Node says the control plane serves a real node (node.go): the
	// apiserver is set up for pods then.
	Node bool `json:"node,omitempty"`
	// NodeIP is the node's address (the apiserver advertises it).
	NodeIP string `json:"nodeIP,omitempty"`
	// RegistryPort is the loopback port of the node's image registry.
	RegistryPort int `json:"registryPort,omitempty"`
}

var components = []string{"etcd", "apiserver"}

// allComponents are the processes of a directory: the control plane, then
// the node's when it has one.
func allComponents(st state) []string {
	if st.Node {
		return append(append([]string{}, components...), nodeComponents...)
	}
	return components
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	cmd := os.Args[1]
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	dir := fs.String("dir", "", "state directory")
	bin := fs.String("bin", "", "directory of the etcd and kube-apiserver binaries")
	component := fs.String("component", "", "etcd or apiserver (restart)")
	timeout := fs.Duration("timeout", 120*time.Second, "how long to wait for readiness")
	withNode := fs.Bool("node", false, "up: also run a node (containerd, kubelet, scheduler, controller-manager, kube-proxy)")
	root := fs.String("root", "", "image: the directory that becomes the image's filesystem")
	tag := fs.String("tag", "", "image: the image's name and tag")
	out := fs.String("out", "", "image: the tarball to write")
	entrypoint := fs.String("entrypoint", "", "image: the entrypoint (JSON array)")
	cmdArgs := fs.String("cmd", "", "image: the default arguments (JSON array)")
	user := fs.String("user", "", "image: the user (uid:gid)")
	expose := fs.String("expose", "", "image: exposed ports (comma list)")
	imageFile := fs.String("image", "", "import: the image tarball")
	_ = fs.Parse(os.Args[2:])
	if cmd == "image" {
		need(*root, "-root")
		need(*tag, "-tag")
		need(*out, "-out")
		ep, err := jsonList(*entrypoint)
		check(err)
		args, err := jsonList(*cmdArgs)
		check(err)
		ports, err := jsonList(*expose)
		check(err)
		check(buildImage(imageSpec{Root: *root, Tag: *tag, Entrypoint: ep, Cmd: args, User: *user, Expose: ports, Out: *out}))
		return
	}
	if *dir == "" {
		usage()
	}
	abs, err := filepath.Abs(*dir)
	check(err)
	*dir = abs
	switch cmd {
	case "up":
		need(*bin, "-bin")
		check(up(*dir, *bin, *withNode, *timeout))
		fmt.Println(filepath.Join(*dir, "kubeconfig"))
	case "down":
		check(down(*dir))
	case "import":
		need(*imageFile, "-image")
		if _, ok := running(*dir, "containerd"); !ok {
			fail(*dir + " has no running node (testenv up DIR --node)")
		}
		check(importImage(*dir, *imageFile))
	case "restart":
		need(*bin, "-bin")
		if *component != "etcd" && *component != "apiserver" {
			fail("restart needs -component etcd or -component apiserver")
		}
		check(restart(*dir, *bin, *component, *timeout))
	case "registry":
		st, err := loadState(*dir)
		check(err)
		if !st.Node || st.RegistryPort == 0 {
			fail(*dir + " has no node registry (testenv up DIR --node)")
		}
		fmt.Printf("127.0.0.1:%d\n", st.RegistryPort)
	case "status":
		st, _ := loadState(*dir)
		for _, c := range allComponents(st) {
			if pid, ok := running(*dir, c); ok {
				fmt.Printf("%s running (pid %d)\n", c, pid)
			} else {
				fmt.Printf("%s stopped\n", c)
			}
		}
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: testenv-ctl up|down|restart|status|import|registry -dir DIR [-bin BINDIR] [-node] [-component etcd|apiserver] [-image FILE]\n"+
		"       testenv-ctl image -root DIR -tag NAME:TAG -out FILE [-entrypoint JSON] [-cmd JSON] [-user U] [-expose P,...]")
	os.Exit(2)
}

func need(v, name string) {
	if v == "" {
		fail(name + " is required")
	}
}

func check(err error) {
	if err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "testenv:", msg)
	os.Exit(1)
}

// up starts whatever is not running and waits until the API answers (and,
// with a node, until the node is Ready).
func up(dir, bin string, withNode bool, timeout time.Duration) error {
	for _, d := range []string{"pki", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "etcd"), 0o700); err != nil {
		return err
	}
	st, err := loadState(dir)
	if err != nil {
		st, err = newState()
		if err != nil {
			return err
		}
		if withNode {
			ip, err := nodeIP()
			if err != nil {
				return err
			}
			st.Node, st.NodeIP = true, ip
		}
		if err := writePKI(dir); err != nil {
			return err
		}
		if err := writeJSON(filepath.Join(dir, "state.json"), st); err != nil {
			return err
		}
	} else if withNode && !st.Node {
		return fmt.Errorf("%s was set up without a node; its apiserver is not set up for pods. Use another directory for --node (or testenv down %s and remove it)", dir, dir)
	}
	if st.Node {
		// Before anything listens or runs: the host is prepared and claimed.
		if err := claimNode(dir); err != nil {
			return err
		}
	}
	if err := writeKubeconfig(dir, st); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	if _, ok := running(dir, "etcd"); !ok {
		if err := start(dir, "etcd", etcdArgs(dir, bin, st)); err != nil {
			return err
		}
	}
	if err := waitEtcd(dir, st, deadline); err != nil {
		return err
	}
	if _, ok := running(dir, "apiserver"); !ok {
		if err := start(dir, "apiserver", apiserverArgs(dir, bin, st)); err != nil {
			return err
		}
	}
	if err := waitAPI(dir, st, deadline); err != nil {
		return err
	}
	if st.Node {
		return nodeUp(dir, bin, st, deadline)
	}
	return nil
}

func restart(dir, bin, component string, timeout time.Duration) error {
	st, err := loadState(dir)
	if err != nil {
		return fmt.Errorf("%s is not a testenv directory (run up first): %w", dir, err)
	}
	if err := stop(dir, component); err != nil {
		return err
	}
	args := etcdArgs(dir, bin, st)
	if component == "apiserver" {
		args = apiserverArgs(dir, bin, st)
	}
	if err := start(dir, component, args); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	if component == "etcd" {
		if err := waitEtcd(dir, st, deadline); err != nil {
			return err
		}
	}
	return waitAPI(dir, st, deadline)
}

func down(dir string) error {
	var errs []error
	if err := nodeDown(dir); err != nil {
		errs = append(errs, err)
	}
	for i := len(components) - 1; i >= 0; i-- {
		if err := stop(dir, components[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func newState() (state, error) {
	var ports [4]int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return state{}, err
		}
		listeners = append(listeners, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return state{EtcdPort: ports[0], PeerPort: ports[1], APIPort: ports[2], RegistryPort: ports[3]}, nil
}

func loadState(dir string) (state, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return st, err
	}
	err = json.Unmarshal(b, &st)
	return st, err
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func etcdArgs(dir, bin string, st state) []string {
	client := fmt.Sprintf("http://127.0.0.1:%d", st.EtcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", st.PeerPort)
	return []string{
		filepath.Join(bin, "etcd"),
		"--name=testenv",
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=testenv=" + peer,
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	}
}

func apiserverArgs(dir, bin string, st state) []string {
	pki := filepath.Join(dir, "pki")
	if st.Node {
		return nodeAPIServerArgs(dir, bin, st)
	}
	return []string{
		filepath.Join(bin, "kube-apiserver"),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", st.EtcdPort),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", st.APIPort),
		"--tls-cert-file=" + filepath.Join(pki, "apiserver.crt"),
		"--tls-private-key-file=" + filepath.Join(pki, "apiserver.key"),
		"--client-ca-file=" + filepath.Join(pki, "ca.crt"),
		fmt.Sprintf("--service-account-issuer=https://127.0.0.1:%d", st.APIPort),
		"--service-account-key-file=" + filepath.Join(pki, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
		"--endpoint-reconciler-type=none",
		"--enable-garbage-collector=false",
		"--cert-dir=" + pki,
		"--v=1",
	}
}

// nodeAPIServerArgs are the apiserver's flags with a node: pods reach it
// through the kubernetes Service (advertised on the node's address, kept by
// the lease endpoint reconciler, routed by kube-proxy), ServiceAccount
// admission gives pods their tokens, and the garbage collector runs.
func nodeAPIServerArgs(dir, bin string, st state) []string {
	pki := filepath.Join(dir, "pki")
	return []string{
		filepath.Join(bin, "kube-apiserver"),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", st.EtcdPort),
		"--bind-address=0.0.0.0",
		"--advertise-address=" + st.NodeIP,
		fmt.Sprintf("--secure-port=%d", st.APIPort),
		"--tls-cert-file=" + filepath.Join(pki, "apiserver.crt"),
		"--tls-private-key-file=" + filepath.Join(pki, "apiserver.key"),
		"--client-ca-file=" + filepath.Join(pki, "ca.crt"),
		fmt.Sprintf("--service-account-issuer=https://127.0.0.1:%d", st.APIPort),
		"--service-account-key-file=" + filepath.Join(pki, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range=" + serviceCIDR,
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		"--endpoint-reconciler-type=lease",
		"--cert-dir=" + pki,
		"--v=1",
	}
}

// alive reports whether a component is running, asking twice before saying
// no: a single look at /proc can miss a process that is just starting.
func alive(dir, name string) bool {
	if _, ok := running(dir, name); ok {
		return true
	}
	time.Sleep(500 * time.Millisecond)
	_, ok := running(dir, name)
	return ok
}

// start launches a component in its own session so that it outlives this
// process, and records its pid and arguments.
func start(dir, name string, args []string) error {
	logf, err := os.OpenFile(filepath.Join(dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "\n==== %s starting %s\n", time.Now().Format(time.RFC3339), name)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Stdin = nil
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	pid := cmd.Process.Pid
	if err := os.WriteFile(filepath.Join(dir, name+".pid"), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".args"), []byte(strings.Join(args, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	// Do not wait: the child is detached. Release our handle on it.
	return cmd.Process.Release()
}

// running reports whether the recorded pid of a component is alive and still
// runs a command started for this directory (a reused pid does not count).
func running(dir, name string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, name+".pid"))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, false
	}
	if !strings.Contains(string(cmdline), dir) {
		return 0, false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err == nil {
		// A zombie (state Z) is not running.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 0 && fields[0] == "Z" {
			return 0, false
		}
	}
	return pid, true
}

// stop sends SIGTERM (SIGCONT first, in case a chaos test paused it), waits up
// to 15 s, then SIGKILL. Stopping a stopped component is not an error.
func stop(dir, name string) error {
	pid, ok := running(dir, name)
	if !ok {
		_ = os.Remove(filepath.Join(dir, name+".pid"))
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGCONT)
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := running(dir, name); !ok {
			_ = os.Remove(filepath.Join(dir, name+".pid"))
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 50; i++ {
		if _, ok := running(dir, name); !ok {
			_ = os.Remove(filepath.Join(dir, name+".pid"))
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s (pid %d) did not stop", name, pid)
}

func waitEtcd(dir string, st state, deadline time.Time) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/health", st.EtcdPort)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if !alive(dir, "etcd") {
			return fmt.Errorf("etcd exited; see %s", filepath.Join(dir, "logs", "etcd.log"))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not healthy in time; see %s", filepath.Join(dir, "logs", "etcd.log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// apiClient is an admin client of DIR's apiserver, and its base URL.
func apiClient(dir string, st state) (*http.Client, string, error) {
	pki := filepath.Join(dir, "pki")
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "admin.crt"), filepath.Join(pki, "admin.key"))
	if err != nil {
		return nil, "", err
	}
	caPEM, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		return nil, "", err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{
		Timeout:   3 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}},
	}
	return client, fmt.Sprintf("https://127.0.0.1:%d", st.APIPort), nil
}

func waitAPI(dir string, st state, deadline time.Time) error {
	client, base, err := apiClient(dir, st)
	if err != nil {
		return err
	}
	for _, path := range []string{"/readyz", "/api/v1/namespaces/default"} {
		for {
			resp, err := client.Get(base + path)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if !alive(dir, "apiserver") {
				return fmt.Errorf("kube-apiserver exited; see %s", filepath.Join(dir, "logs", "apiserver.log"))
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("kube-apiserver not ready (%s) in time; see %s", path, filepath.Join(dir, "logs", "apiserver.log"))
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	return nil
}

type keyPair struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

func issue(parent *keyPair, tmpl *x509.Certificate) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return keyPair{}, err
	}
	tmpl.SerialNumber = serial.Add(serial, big.NewInt(1))
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().AddDate(10, 0, 0)
	tmpl.BasicConstraintsValid = true
	signer, signKey := tmpl, key
	if parent != nil {
		signer, signKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signKey)
	if err != nil {
		return keyPair{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{cert, der, key}, nil
}

func writePair(dir, name string, p keyPair) error {
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.der})
	keyDER, err := x509.MarshalPKCS8PrivateKey(p.key)
	if err != nil {
		return err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if err := os.WriteFile(filepath.Join(dir, name+".crt"), certPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".key"), keyPEM, 0o600)
}

// writePKI creates the CA, the serving certificate, an admin client
// certificate (group system:masters) and the service-account signing key.
func writePKI(dir string) error {
	pki := filepath.Join(dir, "pki")
	ca, err := issue(nil, &x509.Certificate{
		Subject:  pkix.Name{CommonName: "testenv-ca"},
		IsCA:     true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
	})
	if err != nil {
		return err
	}
	server, err := issue(&ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP("10.0.0.1")},
	})
	if err != nil {
		return err
	}
	admin, err := issue(&ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "testenv-admin", Organization: []string{"system:masters"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return err
	}
	for name, p := range map[string]keyPair{"ca": ca, "apiserver": server, "admin": admin} {
		if err := writePair(pki, name, p); err != nil {
			return err
		}
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(sa)})
	return os.WriteFile(filepath.Join(pki, "sa.key"), saPEM, 0o600)
}

func writeKubeconfig(dir string, st state) error {
	pki := filepath.Join(dir, "pki")
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(pki, name))
		return base64.StdEncoding.EncodeToString(b), err
	}
	ca, err := read("ca.crt")
	if err != nil {
		return err
	}
	cert, err := read("admin.crt")
	if err != nil {
		return err
	}
	key, err := read("admin.key")
	if err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority-data: %s
users:
- name: testenv-admin
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: testenv
  context:
    cluster: testenv
    user: testenv-admin
    namespace: default
current-context: testenv
`, st.APIPort, ca, cert, key)
	return os.WriteFile(filepath.Join(dir, "kubeconfig"), []byte(cfg), 0o600)
}
