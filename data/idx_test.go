package data

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

// idxTyped encodes values as an IDX file of element type typ.
func idxTyped(typ IDXType, dims []uint32, values []float64) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, byte(typ), byte(len(dims))})
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, d)
	}
	for _, v := range values {
		switch typ {
		case IDXUint8:
			b.WriteByte(byte(v))
		case IDXInt8:
			b.WriteByte(byte(int8(v)))
		case IDXInt16:
			binary.Write(&b, binary.BigEndian, int16(v))
		case IDXInt32:
			binary.Write(&b, binary.BigEndian, int32(v))
		case IDXFloat32:
			binary.Write(&b, binary.BigEndian, float32(v))
		case IDXFloat64:
			binary.Write(&b, binary.BigEndian, v)
		}
	}
	return b.Bytes()
}

func seq(n int, f func(i int) float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}

func TestReadIDXAnyTypes(t *testing.T) {
	vals := []float64{-3, 0, 7, 120}
	for _, typ := range []IDXType{IDXInt8, IDXInt16, IDXInt32, IDXFloat32, IDXFloat64} {
		in := idxTyped(typ, []uint32{2, 2}, vals)
		for name, b := range map[string][]byte{"raw": in, "gzip": gz(in)} {
			x, err := ReadIDXAny(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("%v %s: %v", typ, name, err)
			}
			got := x.Float32s(nil)
			if x.Type != typ || x.Len() != 4 || !reflect.DeepEqual(got, []float32{-3, 0, 7, 120}) {
				t.Fatalf("%v %s: type %v values %v", typ, name, x.Type, got)
			}
		}
		if _, err := ReadIDX(bytes.NewReader(in)); !errors.Is(err, ErrUnsupportedType) || !errors.Is(err, ErrBadIDX) {
			t.Fatalf("ReadIDX of %v: err = %v, want ErrUnsupportedType", typ, err)
		}
	}
	in := idxTyped(IDXUint8, []uint32{1, 1, 1, 1, 1, 1, 2}, []float64{200, 9})
	x, err := ReadIDXAny(bytes.NewReader(in))
	if err != nil || len(x.Dims) != 7 || !reflect.DeepEqual(x.Float32s(nil), []float32{200, 9}) {
		t.Fatalf("rank 7: %v %+v", err, x)
	}
}
