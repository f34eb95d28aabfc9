// A grpc.testing.TestService on grpc-go (Debian's golang-google-grpc-dev,
// which ships grpc-go's library and its test service but not its interop
// binaries): the server side of the official deadline and cancel cases,
// reporting what grpc-go's server saw of each call.
//
// The first stdout line is `listening on ADDR`; then one JSON object per
// line:
//
//	{"event": "entered", "tag": METHOD, "remaining_us": N | -1}
//	{"event": "ended",   "tag": METHOD, "why": "deadline exceeded" | "cancelled" | "finished"}
//
// Built in GOPATH mode against Debian's packages (scripts/conformance):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o BIN conformance/go/interop_server.go
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	testpb "google.golang.org/grpc/test/grpc_testing"
)

var mu sync.Mutex

func emit(event map[string]interface{}) {
	line, _ := json.Marshal(event)
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(string(line))
}

// entered reports the budget a call arrived with, and its end once the
// handler returns.
func entered(ctx context.Context, method string) func() {
	remaining := int64(-1)
	if deadline, ok := ctx.Deadline(); ok {
		remaining = time.Until(deadline).Microseconds()
	}
	emit(map[string]interface{}{"event": "entered", "tag": method, "remaining_us": remaining})
	return func() {
		why := "finished"
		switch ctx.Err() {
		case context.DeadlineExceeded:
			why = "deadline exceeded"
		case context.Canceled:
			why = "cancelled"
		}
		emit(map[string]interface{}{"event": "ended", "tag": method, "why": why})
	}
}

type server struct {
	testpb.UnimplementedTestServiceServer
}

func (server) EmptyCall(ctx context.Context, _ *testpb.Empty) (*testpb.Empty, error) {
	return &testpb.Empty{}, nil
}

func (server) UnaryCall(ctx context.Context, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: make([]byte, in.GetResponseSize())}}, nil
}

func (server) StreamingInputCall(stream testpb.TestService_StreamingInputCallServer) error {
	defer entered(stream.Context(), "StreamingInputCall")()
	sum := 0
	for {
		in, err := stream.Recv()
		if err == io.EOF {
			return stream.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: int32(sum)})
		}
		if err != nil {
			return err
		}
		sum += len(in.GetPayload().GetBody())
	}
}

// FullDuplexCall answers each request after its responses' intervals; a
// request without response parameters gets no answer: the "sleeping
// server" of timeout_on_sleeping_server.
func (server) FullDuplexCall(stream testpb.TestService_FullDuplexCallServer) error {
	ctx := stream.Context()
	defer entered(ctx, "FullDuplexCall")()
	for {
		in, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		for _, p := range in.GetResponseParameters() {
			select {
			case <-time.After(time.Duration(p.GetIntervalUs()) * time.Microsecond):
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
			body := make([]byte, p.GetSize())
			if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: body}}); err != nil {
				return err
			}
		}
		if len(in.GetResponseParameters()) == 0 {
			<-ctx.Done()
			return status.Error(codes.Canceled, ctx.Err().Error())
		}
	}
}

func main() {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("listening on %s\n", listener.Addr())
	s := grpc.NewServer()
	testpb.RegisterTestServiceServer(s, server{})
	if err := s.Serve(listener); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
