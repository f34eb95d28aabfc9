// A grpc-go root that retries: -calls calls of
// conformance.relay.Relay/Forward, one at a time, each with a 5 s deadline,
// through a channel whose service config retries UNAVAILABLE (maxAttempts
// 3), as gRPC's A6 specifies and grpc-go implements it (GRPC_GO_RETRY=on in
// grpc-go 1.33). Call i carries the tag "TAG-i/0/none" for the flaky
// downstream (conformance/python/flaky.py). Prints one JSON line: how many
// calls, how many answered OK, and the codes of the others.
//
// The request is written by hand (ForwardRequest: tag = 3), so no generated
// code is needed. Built in GOPATH mode against Debian's packages
// (scripts/conformance):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o BIN conformance/go/retry_root.go
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

const method = "/conformance.relay.Relay/Forward"

const serviceConfig = `{"methodConfig": [{
  "name": [{"service": "conformance.relay.Relay"}],
  "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
                  "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`

// raw passes a message's bytes as they are.
type raw struct{}

func (raw) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }
func (raw) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (raw) Name() string { return "proto" }

func varint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// forwardRequest encodes ForwardRequest{tag}.
func forwardRequest(tag string) []byte {
	b := varint([]byte{0x1a}, uint64(len(tag)))
	return append(b, tag...)
}

type result struct {
	Client string         `json:"client"`
	Calls  int            `json:"calls"`
	Ok     int            `json:"ok"`
	Codes  map[string]int `json:"codes"`
}

func run(addr string, calls int, tag string) (*result, error) {
	conn, err := grpc.Dial(addr, grpc.WithInsecure(), grpc.WithBlock(), grpc.WithTimeout(10*time.Second),
		grpc.WithDefaultServiceConfig(serviceConfig))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	r := &result{Client: "grpc-go " + grpc.Version, Codes: map[string]int{}}
	for i := 0; i < calls; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		request := forwardRequest(fmt.Sprintf("%s-%d/0/none", tag, i))
		var reply []byte
		err := conn.Invoke(ctx, method, &request, &reply, grpc.ForceCodec(raw{}))
		cancel()
		r.Calls++
		if err == nil {
			r.Ok++
		} else {
			r.Codes[status.Convert(err).Code().String()]++
		}
	}
	return r, nil
}

func main() {
	addr := flag.String("addr", "", "the relay, HOST:PORT")
	calls := flag.Int("calls", 20, "calls, one at a time")
	tag := flag.String("tag", "retry-root", "the calls' tag prefix")
	flag.Parse()
	r, err := run(*addr, *calls, *tag)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	line, _ := json.Marshal(r)
	fmt.Println(string(line))
}
