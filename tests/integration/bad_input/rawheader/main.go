// Produces one record whose header key is raw bytes, as a Go client can (Kafka's header keys are
// bytes on the wire; Go strings hold any bytes). confluent-kafka-python cannot write such a key:
// it turns a bytes key into its str() text, so the worker's bad-header tests use this program.
//
// Usage: rawheader BOOTSTRAP TOPIC PARTITION KEY HEADER_KEY_HEX HEADER_VALUE < value
package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	if len(os.Args) != 7 {
		fmt.Fprintln(os.Stderr, "usage: rawheader BOOTSTRAP TOPIC PARTITION KEY HEADER_KEY_HEX HEADER_VALUE < value")
		os.Exit(2)
	}
	partition, err := strconv.ParseInt(os.Args[3], 10, 32)
	check(err)
	headerKey, err := hex.DecodeString(os.Args[5])
	check(err)
	value, err := io.ReadAll(os.Stdin)
	check(err)
	client, err := kgo.NewClient(
		kgo.SeedBrokers(os.Args[1]),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	)
	check(err)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	record := &kgo.Record{
		Topic:     os.Args[2],
		Partition: int32(partition),
		Key:       []byte(os.Args[4]),
		Value:     value,
		Headers:   []kgo.RecordHeader{{Key: string(headerKey), Value: []byte(os.Args[6])}},
	}
	check(client.ProduceSync(ctx, record).FirstErr())
	fmt.Printf("%d %d\n", record.Partition, record.Offset)
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
