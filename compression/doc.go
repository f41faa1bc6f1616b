// Package compression turns gradient and model-delta vectors into bytes and
// back: the codecs peers use on the wire, the error-feedback state that makes
// lossy codecs train as well as exact ones, an entropy stage, and the helpers
// an all-reduce uses to sum encoded vectors hop by hop.
//
// # Model
//
// A Codec maps a []float32 to bytes and back. Encoding is append-style and
// allocation-free once dst has capacity:
//
//	c, err := compression.Parse("topk:0.01,ef") // from --compress
//	buf = c.Encode(buf, grad)                   // reuses buf
//	// send c.ID() in the frame header and buf as the payload
//
//	d, err := compression.New(id, "")           // receiver: id from the frame
//	err = d.Decode(vec, payload)                // len(vec) is the authority
//
// Every encoding starts with the codec id and the vector length and carries
// its parameters (block size, k, seed, rank and layout), so a receiver that
// knows only the id and the length decodes it. Decode checks the length in
// the bytes against len(dst) and every field against the bytes that are
// there: malformed input returns an error wrapping ErrCorrupt, ErrLength or
// ErrTooLarge, never panics, and never allocates more than a bound set by
// len(dst) (MaxEncodedLen). On error dst holds unspecified values.
//
// # Codecs
//
// Each codec is one entry of the descriptor table (Descs, Describe): its id,
// name, parameters, and whether it is dense, lossy or sparse. Parse, New,
// Known, MaxEncodedLen and Dense derive from it.
//
//	spec         bytes/value               error                                   id
//	fp32         4                         none (bit-exact)                        0
//	fp16         2                         ≤ 2⁻¹¹·|x| (≤ 2⁻²⁵ below 2⁻¹⁴); ±65504   1
//	bf16         2                         ≤ 2⁻⁸·|x|                               2
//	int8:256     1 + 4/256                 ≤ absmax(block)/254                     3
//	topk:f       f·(4 + ~1) (zstd: −11 %)  drops all but the k largest |x|        4
//	randk:f      f·4                       drops all but k random x               5
//	sign:1024    1/8 + 4/1024              x ↦ ±mean|x| of its block              6
//	powersgd:r   4·r·(rows+cols)/(rows·cols) rank-r projection per matrix       7
//	fp4:64       1/2 + 4/64                ≤ absmax(block)/6 (E2M1 ±{0,½,1,1½,2,3,4,6}) 8
//	int4:64      1/2 + 4/64                ≤ absmax(block)/14                      9
//
// Measured (BenchmarkEncode, BenchmarkDecode; 16 M gradient-like values, one
// core of a shared 2-core AMD EPYC VM, best of 3): fp16 13.6 / 11.0 GB/s
// encode / decode, bf16 13.9 / 3.8, int8 19.3 / 20.2, topk:0.01 2.2 / 27
// (ratio 79.6; 95.7 with zstd), sign 3.1 / 2.7, randk 8.4 / 16.6, PowerSGD
// rank 4 1.35 / 0.45 (one 4096² matrix). fp16, bf16 and int8 run AVX2/F16C
// kernels (kernels_amd64.s) that give bit-for-bit the pure-Go loops' result;
// build with -tags purego for the pure-Go loops alone (fp16 encode 1.6 GB/s).
// fp4 and int4 (pure Go, 1 M values, 20 runs, same machine, noisy):
// 2.45 / 3.3 and 4.7 / 3.1 GB/s encode / decode, ratio 7.1. Both sum in
// their own format at a reducing hop of an all-reduce (a 4-bit all-reduce).
//
// The stateful codecs (ErrorFeedback, PowerSGD, RandK) implement Stateful to
// save their state with a checkpoint. TopK, RandK, PowerSGD, ErrorFeedback,
// Entropy, Decoder and Combiner hold scratch and must not be used from two
// goroutines at once; FP32, FP16, BF16, Int8, Sign, FP4 and Int4 are stateless values
// safe for concurrent use. Every Decode is pure.
//
// # Error feedback
//
// NewErrorFeedback(c) (spec flag "ef") keeps what c did not send and adds it
// to the next vector. The sum of the decoded vectors then equals the sum of
// the inputs minus the current residual, which stays bounded: for a codec
// that keeps at least a fraction δ of the energy (top-k: δ = k/n),
// ‖e‖ ≤ √(1−δ)/(1−√(1−δ)) · max‖x‖. The tests check both.
//
// # Entropy stage
//
// NewEntropy(c, EntropyZstd or EntropyS2) (spec "entropy=zstd|s2") wraps the
// bytes and stores any message it cannot shrink by 1/32. "entropy=auto", the
// default, enables zstd only where BenchmarkEntropy shows it pays
// (Desc.Entropy; the figures are in docs/design.md, "Compression").
//
// # All-reduce
//
// An all-reduce of aggregate/ (a tree, or a butterfly's reduce-scatter and
// all-gather) sums encoded vectors hop by hop: a reducing hop adds what
// meets there with a Combiner (sparse encodings merged exactly by
// MergeSparse, dense ones decoded, summed and re-encoded with HopCodec) and
// the broadcast half forwards the root's (the chunk owner's) bytes
// unchanged, so every peer decodes the same bytes and ends with
// bit-identical vectors. The rule per codec and how exact it is are in
// docs/design.md ("All-reduce").
//
// PowerSGD is linear in M for a fixed Q, so its all-reduce is two dense
// all-reduces of small vectors (sum or mean, fp32 or fp16 on the wire):
//
//	p := ps.Project(p, grad)         // P_i = M_i·Q (+ raw tensors)
//	allReduce(p)                     // P = Σ P_i
//	q := ps.Backproject(q, grad, p)  // P̂ = orthonormalise(P); Q_i = M_iᵀ·P̂
//	allReduce(q)                     // Q = Σ Q_i
//	ps.Reconstruct(out, p, q)        // out = P̂·Qᵀ = PowerSGD(Σ M_i)
//	ps.SetWarmStart(q)               // every peer starts the next step from Q
//
// With error feedback, peer i keeps e_i = M_i − P̂·Q_iᵀ on its matrices (raw
// tensors have no error).
package compression
