// Command fake-cri serves the Kubernetes project's own fake container runtime
// (k8s.io/cri-client/pkg/fake, the one kubelet's tests use) on a unix socket, so a real
// kubelet can run pods here without containerd: sandboxes and containers are records in
// memory, nothing is executed.
//
//	fake-cri --endpoint unix:///tmp/x/cri.sock
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/cri-client/pkg/fake"
)

func main() {
	endpoint := flag.String("endpoint", "", "unix:///path/to/socket (required)")
	flag.Parse()
	if *endpoint == "" {
		log.Fatal("fake-cri: --endpoint is required")
	}
	rt := fake.NewFakeRemoteRuntime()
	// The CRI client in kubelet rejects an image whose id or size is unset ("Id or size of
	// image ... is not set", k8s.io/cri-client/pkg/remote_image.go), and the fake's pulled
	// images have size FakeImageSize, 0 by default: give them a size so containers start.
	rt.ImageService.SetFakeImageSize(1 << 20)
	if err := rt.Start(*endpoint); err != nil {
		log.Fatalf("fake-cri: start on %s: %v", *endpoint, err)
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	rt.Stop()
}
