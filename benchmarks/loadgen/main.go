// Command loadgen offers a fixed request rate to one HTTP endpoint over a fixed number of keep-alive
// connections and prints what came back as one JSON object: the benchmarks' load generator
// (benchmarks/proxy_cost.py). Go's net/http client costs a few µs a request, so at the rates used here it
// is not the bottleneck, and it keeps its schedule: requests are sent at their planned instant when a
// connection is free; a request that finds every connection busy is counted as late (sent as soon as one
// frees), so an overloaded arm shows up as late requests instead of a silently lower rate.
//
//	loadgen -url http://127.0.0.1:8080/v1/chat/completions -rate 2000 -seconds 5 -conns 32 -sessions 256 \
//	        -body '{"model":"tiny",...}' [-stream] [-headers X-Session-ID,x-smg-routing-key] [-prefix arm1-]
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

type result struct {
	Sent     int     `json:"sent"`
	OK       int     `json:"ok"`
	Non2xx   int     `json:"non2xx"`
	Errors   int     `json:"errors"`
	Late     int     `json:"late"`
	Events   int     `json:"events"` // SSE data lines, [DONE] included
	Done     int     `json:"done"`   // streams that ended with data: [DONE]
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	Seconds  float64 `json:"seconds"`
	Rate     float64 `json:"achieved_rate"`
	FirstErr string  `json:"first_error,omitempty"`
}

type outcome struct {
	latency      time.Duration
	status       int
	err          error
	events, done int
}

func main() {
	url := flag.String("url", "", "endpoint to POST to")
	rate := flag.Float64("rate", 2000, "requests per second offered")
	seconds := flag.Float64("seconds", 5, "how long to offer load")
	conns := flag.Int("conns", 32, "keep-alive connections (concurrent requests at most)")
	sessions := flag.Int("sessions", 256, "X-Session-ID values, rotated request by request")
	body := flag.String("body", `{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`,
		"JSON body; %SESSION% in it is replaced by the request's session id")
	stream := flag.Bool("stream", false, "read the answer as SSE and count its events")
	headers := flag.String("headers", "X-Session-ID", "comma-separated header names that carry the session id")
	prefix := flag.String("prefix", "session-", "session ids are PREFIX0 ... PREFIX(sessions-1)")
	flag.Parse()
	if *url == "" || *rate <= 0 || *seconds <= 0 || *conns < 1 || *sessions < 1 {
		fmt.Fprintln(os.Stderr, "loadgen: -url is required; -rate, -seconds, -conns and -sessions must be positive")
		os.Exit(2)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: *conns, MaxIdleConnsPerHost: *conns,
		MaxConnsPerHost: *conns, DisableCompression: true, IdleConnTimeout: time.Minute}, Timeout: 30 * time.Second}
	total, names := int(*rate**seconds), strings.Split(*headers, ",")
	jobs := make(chan int, total)
	outcomes := make(chan outcome, total)
	var wg sync.WaitGroup
	for w := 0; w < *conns; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				session := *prefix + strconv.Itoa(i%*sessions)
				payload := []byte(strings.ReplaceAll(*body, "%SESSION%", session))
				outcomes <- send(client, *url, payload, names, session, *stream)
			}
		}()
	}
	late, start := pace(jobs, total, *rate, *conns)
	close(jobs)
	wg.Wait()
	close(outcomes)
	printResult(collect(outcomes, total, late, time.Since(start)))
}

// pace puts request i on the queue at start + i/rate; when the queue already holds a request for every
// connection the request is late (the arm is not keeping up).
func pace(jobs chan<- int, total int, rate float64, conns int) (int, time.Time) {
	start, late := time.Now(), 0
	interval := time.Duration(float64(time.Second) / rate)
	for i := 0; i < total; i++ {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		if len(jobs) >= conns {
			late++
		}
		jobs <- i
	}
	return late, start
}

func send(client *http.Client, url string, body []byte, headers []string, session string, stream bool) outcome {
	request, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return outcome{err: err}
	}
	request.Header.Set("Content-Type", "application/json")
	for _, name := range headers {
		request.Header.Set(name, session)
	}
	begin := time.Now()
	response, err := client.Do(request)
	if err != nil {
		return outcome{err: err}
	}
	defer response.Body.Close()
	got := outcome{status: response.StatusCode}
	if stream {
		scanner := bufio.NewScanner(response.Body)
		for scanner.Scan() {
			line := scanner.Bytes()
			if bytes.HasPrefix(line, []byte("data:")) {
				got.events++
				if bytes.Equal(bytes.TrimSpace(line[5:]), []byte("[DONE]")) {
					got.done = 1
				}
			}
		}
		got.err = scanner.Err()
	} else {
		_, got.err = io.Copy(io.Discard, response.Body)
	}
	got.latency = time.Since(begin)
	return got
}

func collect(outcomes <-chan outcome, total, late int, elapsed time.Duration) result {
	res := result{Sent: total, Late: late, Seconds: elapsed.Seconds()}
	latencies := make([]float64, 0, total)
	for o := range outcomes {
		switch {
		case o.err != nil:
			res.Errors++
			if res.FirstErr == "" {
				res.FirstErr = o.err.Error()
			}
		case o.status < 200 || o.status > 299:
			res.Non2xx++
		default:
			res.OK++
			res.Events += o.events
			res.Done += o.done
			latencies = append(latencies, float64(o.latency.Microseconds())/1000)
		}
	}
	sort.Float64s(latencies)
	res.P50ms, res.P99ms = quantile(latencies, 0.50), quantile(latencies, 0.99)
	res.Rate = float64(res.OK) / res.Seconds
	return res
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))]
}

func printResult(res result) {
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}
