// Package serve is `peer serve`: a local API through which one client
// process (the Python package in python/, typically a PyTorch training
// loop) uses one swarm membership of this peer: join, all-reduce tensors,
// publish and fetch state, read metrics.
//
// Control goes over a Unix stream socket, one frame per message: a 4-byte
// big-endian length and a JSON object. Tensor bytes never cross the
// socket: the client creates a file in /dev/shm, maps it, and names it in
// a "shm" request; serve maps the same file and reads and writes float32
// values there at the offsets each request gives.
//
//	server → client  {"ok":true,"server":"peer serve","version":1,"pid":…}   (or ok:false, code "busy")
//	client → server  {"op":"join","args":["--swarm","lab",…],"model":"mlp"}
//	server → client  {"ok":true,"id":"12D3…","addrs":[…]}
//	client → server  {"op":"wait","timeout_s":60}       (waits for --min-peers, fixes the group)
//	client → server  {"op":"shm","path":"/dev/shm/…","bytes":N}
//	client → server  {"op":"allreduce","src":0,"dst":N/2,"count":K,"shapes":[[…],…],"weight":1}
//	server → client  {"ok":true,"round":7,"group":[…],"excluded":[…],"weight":3}
//
// One session per connection, one connection at a time: a second client
// gets a greeting with ok:false and code "busy". When the client's
// connection closes (it exited or died), serve cancels a call in flight,
// says in its heartbeat that it stopped, and closes the swarm peer: the
// other peers drop it from their rounds and go on.
//
// Rounds. Every member's client must issue the same sequence of
// all-reduces: round numbers are the session's call count. The group of a
// round is the group of the last one that succeeded (at first the live
// members once --min-peers are there), as in train.Sync. A call's shapes
// are hashed into the round's settings (aggregate.Config.Model), so a peer
// whose tensors differ in shape from the others' is excluded from the
// round with a clear error instead of averaging unrelated values.
package serve
