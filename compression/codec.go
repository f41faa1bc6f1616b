package compression

// ID is a codec's stable identifier on the wire: node/ frames carry it in
// their header, so a value, once assigned, never changes meaning.
type ID uint8

// Codec ids. New codecs take the next free value and an entry in the
// descriptor table (registry.go).
const (
	IDFP32     ID = 0  // raw little-endian float32 (no compression)
	IDFP16     ID = 1  // IEEE 754 half precision
	IDBF16     ID = 2  // bfloat16, round to nearest even
	IDInt8     ID = 3  // int8 blockwise with a per-block absmax scale
	IDTopK     ID = 4  // top-k sparsification, delta-encoded indices
	IDRandK    ID = 5  // random-k sparsification
	IDSign     ID = 6  // 1 bit per value plus a scale (EF-SignSGD)
	IDPowerSGD ID = 7  // low-rank P/Q factors of a matrix
	IDFP4      ID = 8  // 4-bit floats (E2M1) with a per-block scale
	IDInt4     ID = 9  // 4-bit integers with a per-block absmax scale
	IDSparse   ID = 10 // every nonzero value, top-k's layout (lossless)

	// IDEntropy is set on top of another id when the encoded bytes were
	// further wrapped by the entropy stage (zstd or S2).
	IDEntropy ID = 0x80
)

// Known reports whether id names a codec this build can decode.
func Known(id ID) bool { return desc(id) != nil }

// Codec turns a float32 vector into bytes and back. Implementations are
// append-style and allocation-free on the hot path once dst has capacity.
type Codec interface {
	// ID returns the codec's wire id.
	ID() ID
	// Name returns the codec's name with its parameters, e.g. "topk:0.01".
	Name() string
	// Encode appends the encoding of src to dst[:0]'s backing array and
	// returns the result.
	Encode(dst []byte, src []float32) []byte
	// Decode fills dst (whose length is the vector length) from src. It
	// returns an error, never panics, on malformed input.
	Decode(dst []float32, src []byte) error
}
