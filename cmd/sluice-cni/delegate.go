package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// The delegate: sluice-cni as the chain's interface step, running the
// interface plugin (conf "delegate", e.g. bridge with its ipam) itself.
//
// Chained after bridge, a pinned pod fails the whole list's CHECK at the
// bridge step: bridge's CHECK looks for the pod's veth, which the pin
// removed on purpose. With the delegate, the list is [loopback,
// sluice-cni{delegate: bridge}]; sluice-cni's ADD runs bridge's ADD and
// then pins, and its CHECK answers for both: the pin (sandboxd: only lo,
// no route, the backstop, the listeners) and what of the delegate's work
// the pin keeps, its IPAM reservation (the IPAM plugin's own CHECK).
// Bridge's CHECK of the veth is not run: the veth is gone by design. DEL
// unpins, then runs the delegate's DEL (the host side of the veth, the
// address).

// delegateConf is the delegate's network configuration as a plugin gets
// it: its own keys, and the list's cniVersion and name (and prevResult
// when given).
func delegateConf(c *Conf, prev types.Result) (typ string, conf []byte, err error) {
	var d map[string]any
	if err := json.Unmarshal(c.Delegate, &d); err != nil {
		return "", nil, fmt.Errorf("sluice-cni: config: delegate: %w", err)
	}
	typ, _ = d["type"].(string)
	if typ == "" || typ == "sluice-cni" {
		return "", nil, errors.New("sluice-cni: config: delegate: want the interface plugin's configuration, with its type")
	}
	d["cniVersion"], d["name"] = c.CNIVersion, c.Name
	delete(d, "prevResult")
	if prev != nil {
		d["prevResult"] = prev
	}
	conf, err = json.Marshal(d)
	return typ, conf, err
}

// delegateAdd runs the delegate's ADD and returns its result.
func delegateAdd(c *Conf) (*current.Result, error) {
	typ, conf, err := delegateConf(c, nil)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "sluice-cni: bad config", err.Error())
	}
	r, err := invoke.DelegateAdd(context.Background(), typ, conf, nil)
	if err != nil {
		return nil, err // the delegate's own error, code and all
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "sluice-cni: delegate result", err.Error())
	}
	return res, nil
}

// delegateCheck runs the CHECK of the delegate's IPAM plugin, with the
// delegate's configuration and the result sluice-cni returned.
func delegateCheck(c *Conf) error {
	var d struct {
		IPAM struct {
			Type string `json:"type"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(c.Delegate, &d); err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "sluice-cni: bad config", err.Error())
	}
	if d.IPAM.Type == "" {
		return nil
	}
	_, conf, err := delegateConf(c, c.PrevResult)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "sluice-cni: bad config", err.Error())
	}
	return invoke.DelegateCheck(context.Background(), d.IPAM.Type, conf, nil)
}

// delegateDel runs the delegate's DEL.
func delegateDel(c *Conf) error {
	typ, conf, err := delegateConf(c, c.PrevResult)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "sluice-cni: bad config", err.Error())
	}
	return invoke.DelegateDel(context.Background(), typ, conf, nil)
}
