// Command etcd runs a single-member etcd on loopback for the real-control-plane tests.
//
//	etcd --data-dir DIR --client-url http://127.0.0.1:PORT --peer-url http://127.0.0.1:PORT
//
// It prints "ready" on stdout once the server serves clients and stops on SIGTERM/SIGINT.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func mustURL(raw string) url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		log.Fatalf("etcd: bad url %q: %v", raw, err)
	}
	if h := u.Hostname(); h != "127.0.0.1" && h != "localhost" && h != "::1" {
		log.Fatalf("etcd: %q is not a loopback address; this etcd serves tests on loopback only", raw)
	}
	return *u
}

func main() {
	dir := flag.String("data-dir", "", "data folder (required)")
	client := flag.String("client-url", "http://127.0.0.1:2379", "client URL (loopback only)")
	peer := flag.String("peer-url", "http://127.0.0.1:2380", "peer URL (loopback only)")
	flag.Parse()
	if *dir == "" {
		log.Fatal("etcd: --data-dir is required")
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dir
	cfg.Name = "gpuslice-test"
	c, p := mustURL(*client), mustURL(*peer)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{c}, []url.URL{c}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{p}, []url.URL{p}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	// Tests create and delete thousands of objects; keep the data folder small.
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "1m"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("etcd: start: %v", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Println("ready")
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		log.Fatal("etcd: not ready after 60 s")
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sig:
		log.Printf("etcd: %v, stopping", s)
	case err := <-e.Err():
		log.Fatalf("etcd: %v", err)
	}
}
