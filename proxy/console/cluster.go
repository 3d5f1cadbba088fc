package console

import "math"

// ClusterRow is one line of SHOW CLUSTER and /debug/cluster: for every
// instance of the cluster, and every cluster application it holds a row
// for, the slots it holds and wants. An instance with no slot row yet
// shows one line with an empty application.
type ClusterRow struct {
	Cluster      string  `json:"cluster"`
	Instance     string  `json:"instance"`
	Number       int     `json:"number"`
	Address      string  `json:"address"`
	Self         bool    `json:"self"`
	Live         bool    `json:"live"`
	HeartbeatAge float64 `json:"heartbeat_age"` // seconds, by the server's clock
	Application  string  `json:"application"`
	Slots        int     `json:"slots"`
	Pins         int     `json:"pins"`
	Demand       int     `json:"demand"`
	PinDemand    int     `json:"pin_demand"`
}

// clusterRows gathers SHOW CLUSTER from the coordinator's last tick (no
// rows without a cluster).
func clusterRows(src Source) []ClusterRow {
	out := []ClusterRow{}
	co := src.Cluster()
	if co == nil {
		return out
	}
	v := co.Snapshot()
	name := src.StartedConfig().Cluster.Name
	for _, in := range v.Instances {
		base := ClusterRow{Cluster: name, Instance: in.Instance, Number: in.Number, Address: in.Address, Self: in.Self, Live: in.Live,
			HeartbeatAge: math.Round(in.HeartbeatAge.Seconds()*1000) / 1000}
		n := 0
		for _, sv := range v.Slots {
			if sv.Instance != in.Instance {
				continue
			}
			r := base
			r.Application, r.Slots, r.Pins, r.Demand, r.PinDemand = sv.App, sv.Slots, sv.Pins, sv.Demand, sv.PinDemand
			out = append(out, r)
			n++
		}
		if n == 0 {
			out = append(out, base)
		}
	}
	return out
}
