package harness

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// LoopbackProxy is a reverse proxy to the API server on loopback, authenticating as the user of an
// upstream kubeconfig, with a kubeconfig of its own: a place to watch or disturb one client's
// requests. Plain HTTP on loopback.
type LoopbackProxy struct {
	// Kubeconfig is a kubeconfig file whose server is the proxy.
	Kubeconfig string
	URL        string

	srv *http.Server
}

// StartLoopbackProxy starts a proxy to the API server of upstreamKubeconfig and writes
// <dir>/<name>.kubeconfig. serve handles every request and passes those it lets through to
// upstream.
func StartLoopbackProxy(dir, name, upstreamKubeconfig string, serve func(w http.ResponseWriter, r *http.Request, upstream http.Handler)) (*LoopbackProxy, error) {
	upstream, err := clientcmd.BuildConfigFromFlags("", upstreamKubeconfig)
	if err != nil {
		return nil, err
	}
	transport, err := rest.TransportFor(upstream)
	if err != nil {
		return nil, err
	}
	target, err := url.Parse(upstream.Host)
	if err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
		},
		Transport: transport,
		// Watches stream: every event goes through at once.
		FlushInterval: -1,
		// Aborted watches and injected resets are expected here, not news.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	p := &LoopbackProxy{URL: "http://" + l.Addr().String()}
	p.srv = &http.Server{
		Handler:  http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { serve(w, r, proxy) }),
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go func() { _ = p.srv.Serve(l) }()

	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: p.URL}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	cfg.CurrentContext = name
	p.Kubeconfig = filepath.Join(dir, name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, p.Kubeconfig); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close stops the proxy.
func (p *LoopbackProxy) Close() { _ = p.srv.Close() }
