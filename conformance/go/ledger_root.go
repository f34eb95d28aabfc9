// A grpc-go root over our relay: -calls calls of
// conformance.relay.Relay/Forward, one at a time, each with a context
// deadline -timeout_ms ahead, to a downstream that works 5 s. Prints one JSON
// line: how many failed DEADLINE_EXCEEDED, how many of those carried the
// ledger (a google.rpc.DebugInfo with the ledger's detail among the status's
// details, as grpc-go's own status package decodes them, and ` [ledger] ` in
// the message), the relay's budget as each ledger gave it, and one message
// whole.
//
// The request is written by hand (ForwardRequest: work_ms = 2, tag = 3), so no
// generated code is needed. Built in GOPATH mode against Debian's packages
// (scripts/conformance):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o BIN conformance/go/ledger_root.go
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/golang/protobuf/proto"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const method = "/conformance.relay.Relay/Forward"
const detail = "tonic-deadline ledger/1"

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

// forwardRequest encodes ForwardRequest{work_ms, tag}.
func forwardRequest(workMs uint64, tag string) []byte {
	b := []byte{}
	if workMs > 0 {
		b = varint(append(b, 0x10), workMs)
	}
	b = varint(append(b, 0x1a), uint64(len(tag)))
	return append(b, tag...)
}

func call(conn *grpc.ClientConn, timeout time.Duration, workMs uint64, tag string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	request := forwardRequest(workMs, tag)
	var reply []byte
	return conn.Invoke(ctx, method, &request, &reply, grpc.ForceCodec(raw{}))
}

// carriesLedger: the status's details hold the ledger's DebugInfo.
func carriesLedger(s *status.Status) bool {
	for _, any := range s.Proto().GetDetails() {
		if !strings.HasSuffix(any.GetTypeUrl(), "/google.rpc.DebugInfo") {
			continue
		}
		var info errdetails.DebugInfo
		if proto.Unmarshal(any.GetValue(), &info) == nil && info.GetDetail() == detail {
			return true
		}
	}
	return false
}

type result struct {
	Client           string         `json:"client"`
	Calls            int            `json:"calls"`
	DeadlineExceeded int            `json:"deadline_exceeded"`
	Carried          int            `json:"carried"`
	BudgetsMs        []float64      `json:"budgets_ms"`
	Codes            map[string]int `json:"codes"`
	Example          *string        `json:"example"`
}

func run(addr string, calls int, timeout time.Duration) (*result, error) {
	conn, err := grpc.Dial(addr, grpc.WithInsecure(), grpc.WithBlock(), grpc.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	if err := call(conn, 5*time.Second, 0, "warm-up"); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	budget := regexp.MustCompile(`\[ledger\] ([\d.]+) ms budget`)
	r := &result{Client: "grpc-go " + grpc.Version, BudgetsMs: []float64{}, Codes: map[string]int{}}
	for i := 0; i < calls; i++ {
		err := call(conn, timeout, 5000, fmt.Sprintf("ledger-root-%d", i))
		s := status.Convert(err)
		r.Calls++
		r.Codes[s.Code().String()]++
		if s.Code() != codes.DeadlineExceeded {
			continue
		}
		r.DeadlineExceeded++
		found := budget.FindStringSubmatch(s.Message())
		if carriesLedger(s) && found != nil {
			r.Carried++
			ms, _ := strconv.ParseFloat(found[1], 64)
			r.BudgetsMs = append(r.BudgetsMs, ms)
			if r.Example == nil {
				message := s.Message()
				r.Example = &message
			}
		}
	}
	return r, nil
}

func main() {
	addr := flag.String("addr", "", "the relay, HOST:PORT")
	calls := flag.Int("calls", 20, "calls, one at a time")
	timeoutMs := flag.Int("timeout_ms", 300, "each call's deadline, milliseconds ahead")
	flag.Parse()
	r, err := run(*addr, *calls, time.Duration(*timeoutMs)*time.Millisecond)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	line, _ := json.Marshal(r)
	fmt.Println(string(line))
}
