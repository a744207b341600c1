package mitm_test

import (
	"fmt"
	"os"

	"github.com/sluice-gw/sluice/gateway/mitm"
)

func ExampleAuthority_Leaf() {
	dir, _ := os.MkdirTemp("", "mitm-example-")
	defer os.RemoveAll(dir)
	ca, err := mitm.LoadOrCreate(dir, mitm.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	leaf, err := ca.Leaf("api.github.com")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(leaf.Leaf.DNSNames, leaf.Leaf.NotAfter.Sub(leaf.Leaf.NotBefore) > mitm.LeafValidity)
	// Output: [api.github.com] true
}
