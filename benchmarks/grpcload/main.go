// Command grpcload offers a fixed rate of gRPC server-streaming calls (vLLM's VllmEngine/Generate) over a few
// HTTP/2 connections and prints what came back as one JSON object: the load generator of
// benchmarks/grpc_cost.py, as benchmarks/loadgen is proxy_cost.py's. It speaks gRPC's wire format itself over
// golang.org/x/net/http2 (h2c, prior knowledge): each call is a POST with one length-prefixed request message
// and the metadata a gRPC client sends (content-type application/grpc, te trailers, the session id), and its
// answer is read message by message to its trailers. A call counts as ok when its grpc-status is 0 and it
// brought -messages messages. Calls start at their planned instants, each on a goroutine of its own, spread
// over -conns connections in turn; at most -max-inflight are in progress: one that finds them all busy waits
// and counts as late (the arm was not keeping up). It stops by itself: no call starts after -seconds, and
// each has -timeout to finish.
//
//	grpcload -target 127.0.0.1:50051 -rate 200 -seconds 4 -conns 4 -sessions 256 -prefix arm1- \
//	         -messages 16 -request HEX [-interval-ms 10]
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"
)

const method = "/vllm.grpc.engine.VllmEngine/Generate"

type result struct {
	Sent      int     `json:"sent"`
	OK        int     `json:"ok"`
	Failed    int     `json:"failed"` // an error, a status other than 0, or not -messages messages
	Messages  int     `json:"messages"`
	Late      int     `json:"late"`
	P50ms     float64 `json:"p50_ms"`
	P99ms     float64 `json:"p99_ms"`
	Seconds   float64 `json:"seconds"`
	CPUs      float64 `json:"loadgen_cpu_s"` // this process's own utime + stime
	FirstFail string  `json:"first_failure,omitempty"`
}

type outcome struct {
	latency  time.Duration
	messages int
	fail     string
}

func main() {
	target := flag.String("target", "", "host:port of the gRPC listener")
	rate := flag.Float64("rate", 200, "calls per second offered")
	seconds := flag.Float64("seconds", 4, "how long to offer load")
	conns := flag.Int("conns", 4, "HTTP/2 connections, calls spread over them in turn")
	sessions := flag.Int("sessions", 256, "x-session-id values, rotated call by call")
	prefix := flag.String("prefix", "session-", "session ids are PREFIX0 ... PREFIX(sessions-1)")
	messages := flag.Int("messages", 16, "messages each call must bring")
	request := flag.String("request", "", "the request message, hex (a serialized GenerateRequest)")
	interval := flag.Int("interval-ms", -1, "sent as x-bench-interval-ms metadata when 0 or more")
	maxInflight := flag.Int("max-inflight", 1024, "calls in progress at most")
	timeout := flag.Duration("timeout", 10*time.Second, "each call's deadline")
	flag.Parse()
	body, err := hex.DecodeString(*request)
	if *target == "" || err != nil || *rate <= 0 || *seconds <= 0 || *conns < 1 || *sessions < 1 {
		fmt.Fprintln(os.Stderr, "grpcload: -target and a hex -request are required; -rate, -seconds, -conns, -sessions positive")
		os.Exit(2)
	}
	framed := make([]byte, 5+len(body))
	binary.BigEndian.PutUint32(framed[1:5], uint32(len(body)))
	copy(framed[5:], body)

	clients := make([]*http2.ClientConn, *conns)
	transport := &http2.Transport{AllowHTTP: true, DisableCompression: true}
	for i := range clients {
		raw, err := net.DialTimeout("tcp", *target, 5*time.Second)
		if err == nil {
			clients[i], err = transport.NewClientConn(raw)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "grpcload:", err)
			os.Exit(1)
		}
	}

	total := int(*rate * *seconds)
	outcomes := make(chan outcome, total)
	slots := make(chan struct{}, *maxInflight)
	var wg sync.WaitGroup
	late := 0
	begun := time.Now()
	for i := 0; i < total; i++ {
		planned := begun.Add(time.Duration(float64(i) / *rate * float64(time.Second)))
		if wait := time.Until(planned); wait > 0 {
			time.Sleep(wait)
		}
		select {
		case slots <- struct{}{}:
		default:
			late++
			slots <- struct{}{}
		}
		wg.Add(1)
		go func(i int, planned time.Time) {
			defer wg.Done()
			defer func() { <-slots }()
			session := *prefix + strconv.Itoa(i%*sessions)
			outcomes <- call(clients[i%len(clients)], *target, framed, session, *interval, *messages, planned, *timeout)
		}(i, planned)
	}
	wg.Wait()
	close(outcomes)
	elapsed := time.Since(begun)
	out := result{Sent: total, Late: late, Seconds: elapsed.Seconds()}
	var latencies []time.Duration
	for o := range outcomes {
		out.Messages += o.messages
		if o.fail != "" {
			out.Failed++
			if out.FirstFail == "" {
				out.FirstFail = o.fail
			}
			continue
		}
		out.OK++
		latencies = append(latencies, o.latency)
	}
	if len(latencies) > 0 {
		sort.Slice(latencies, func(a, b int) bool { return latencies[a] < latencies[b] })
		ms := func(q float64) float64 {
			return float64(latencies[int(q*float64(len(latencies)-1))].Microseconds()) / 1000
		}
		out.P50ms, out.P99ms = ms(0.50), ms(0.99)
	}
	var usage syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &usage) == nil {
		out.CPUs = time.Duration(usage.Utime.Nano() + usage.Stime.Nano()).Seconds()
	}
	for _, c := range clients {
		c.Close()
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

// call makes one Generate call and reads its answer to the end: the time from its planned instant, the messages
// it brought, and why it failed ("" when it did not).
func call(client *http2.ClientConn, target string, framed []byte, session string, interval, want int,
	planned time.Time, timeout time.Duration) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+target+method, io.NopCloser(bytes.NewReader(framed)))
	req.ContentLength = -1 // as a gRPC client: no content-length
	req.Header.Set("content-type", "application/grpc")
	req.Header.Set("te", "trailers")
	req.Header.Set("user-agent", "grpc-go/1.70.0")
	req.Header.Set("grpc-timeout", strconv.FormatInt(timeout.Milliseconds(), 10)+"m")
	req.Header.Set("x-session-id", session)
	if interval >= 0 {
		req.Header.Set("x-bench-interval-ms", strconv.Itoa(interval))
	}
	resp, err := client.RoundTrip(req)
	if err != nil {
		return outcome{fail: err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return outcome{fail: "HTTP " + resp.Status}
	}
	count, prefix := 0, make([]byte, 5)
	for {
		if _, err := io.ReadFull(resp.Body, prefix); err != nil {
			if err != io.EOF {
				return outcome{messages: count, fail: err.Error()}
			}
			break
		}
		if _, err := io.CopyN(io.Discard, resp.Body, int64(binary.BigEndian.Uint32(prefix[1:]))); err != nil {
			return outcome{messages: count, fail: err.Error()}
		}
		count++
	}
	status := resp.Trailer.Get("grpc-status")
	if status == "" {
		status = resp.Header.Get("grpc-status") // a trailers-only answer
	}
	if status != "0" {
		return outcome{messages: count, fail: "grpc-status " + status + " " + resp.Trailer.Get("grpc-message") +
			resp.Header.Get("grpc-message")}
	}
	if count != want {
		return outcome{messages: count, fail: fmt.Sprintf("%d messages, not %d", count, want)}
	}
	return outcome{latency: time.Since(planned), messages: count}
}
