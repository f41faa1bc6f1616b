package data

import (
	"fmt"
	"math"
	"slices"
)

// Norm selects how LoadIDX standardises inputs. The statistics always come
// from the training split and are applied to both splits.
type Norm uint8

const (
	// NormPerChannel subtracts each channel's mean and divides by its
	// standard deviation. The channel is the last axis of a sample of rank
	// three or more (H, W, C); a sample of lower rank has one channel.
	NormPerChannel Norm = iota
	// NormGlobal uses one mean and standard deviation over all values.
	NormGlobal
	// NormNone keeps the stored values, converted to float32.
	NormNone
)

func (n Norm) String() string {
	switch n {
	case NormPerChannel:
		return "per-channel"
	case NormGlobal:
		return "global"
	case NormNone:
		return "none"
	}
	return fmt.Sprintf("Norm(%d)", uint8(n))
}

// IDXConfig says how LoadIDX turns IDX files into Sets.
type IDXConfig struct {
	// Classes is the number of classes; every label must lie in
	// [0, Classes). 0 takes the largest label of either split plus one.
	Classes int
	// Norm is the standardisation. Default per channel: it equals global
	// for single-channel data and keeps colour channels comparable.
	Norm Norm
}

// DefaultIDXConfig returns the configuration LoadIDX uses when given the
// zero value: classes from the data, per-channel standardisation.
func DefaultIDXConfig() IDXConfig { return IDXConfig{} }

// Validate reports a configuration LoadIDX cannot follow.
func (c IDXConfig) Validate() error {
	if c.Classes < 0 {
		return fmt.Errorf("%w: IDX config: %d classes", ErrConfig, c.Classes)
	}
	if c.Norm > NormNone {
		return fmt.Errorf("%w: IDX config: unknown normalisation %v", ErrConfig, c.Norm)
	}
	return nil
}

// LoadIDX reads a training and a test split, each an IDX file of inputs
// (N × any sample shape, any IDX element type) and an IDX file of N
// integer labels, raw or gzip. Inputs are standardised with statistics of
// the training split as cfg.Norm says. The test paths may both be empty,
// and test is then nil. Errors name the offending file.
func LoadIDX(trainImages, trainLabels, testImages, testLabels string, cfg IDXConfig) (train, test *Set, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	if (testImages == "") != (testLabels == "") {
		return nil, nil, fmt.Errorf("%w: LoadIDX needs both test files or neither, got %q and %q", ErrConfig, testImages, testLabels)
	}
	tr, err := readIDXSplit(trainImages, trainLabels, nil)
	if err != nil {
		return nil, nil, err
	}
	splits := []*idxSplit{tr}
	if testImages != "" {
		te, err := readIDXSplit(testImages, testLabels, tr.sample)
		if err != nil {
			return nil, nil, err
		}
		splits = append(splits, te)
	}
	classes := cfg.Classes
	if classes == 0 {
		for _, s := range splits {
			classes = max(classes, int(slices.Max(s.set.Y))+1)
		}
	}
	for _, s := range splits {
		for i, l := range s.set.Y {
			if int(l) >= classes {
				return nil, nil, fmt.Errorf("%s: %w: label %d of sample %d, %d classes", s.labelPath, ErrLabelRange, l, i, classes)
			}
		}
		s.set.Classes = classes
	}
	if cfg.Norm != NormNone {
		channels := 1
		if len(tr.sample) >= 3 {
			channels = tr.sample[len(tr.sample)-1]
		}
		if cfg.Norm == NormGlobal {
			channels = 1
		}
		mean, std := channelStats(tr.set.X, channels)
		for _, s := range splits {
			standardise(s.set.X, mean, std)
		}
	}
	train = tr.set
	if len(splits) == 2 {
		test = splits[1].set
	}
	return train, test, nil
}

// idxSplit is one split read from its two files.
type idxSplit struct {
	set       *Set
	sample    []int // per-sample dimensions as the file gives them
	labelPath string
}

// readIDXSplit reads an inputs file and a labels file into a Set without
// classes or normalisation. When want is not nil the samples must have
// that shape (the training split's).
func readIDXSplit(imgPath, lblPath string, want []int) (*idxSplit, error) {
	img, lbl, err := readIDXPair(imgPath, lblPath, true)
	if err != nil {
		return nil, err
	}
	n, sample := img.Dims[0], img.Dims[1:]
	if n == 0 {
		return nil, fmt.Errorf("%s: %w: no samples", imgPath, ErrBadIDX)
	}
	if len(img.Data) == 0 {
		return nil, fmt.Errorf("%s: %w: samples of dimensions %v hold no values", imgPath, ErrBadIDX, sample)
	}
	if want != nil && !slices.Equal(sample, want) {
		return nil, fmt.Errorf("%s: %w: samples are %v, the training split's are %v", imgPath, ErrBadIDX, sample, want)
	}
	if len(lbl.Dims) != 1 {
		return nil, fmt.Errorf("%s: %w: labels have dimensions %v, want one (N)", lblPath, ErrBadIDX, lbl.Dims)
	}
	if lbl.Dims[0] != n {
		return nil, fmt.Errorf("%s: %w: %d labels for the %d samples of %s", lblPath, ErrBadIDX, lbl.Dims[0], n, imgPath)
	}
	raw, err := lbl.ints()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", lblPath, err)
	}
	y := make([]int32, n)
	for i, l := range raw {
		if l < 0 {
			return nil, fmt.Errorf("%s: %w: label %d of sample %d is negative", lblPath, ErrLabelRange, l, i)
		}
		y[i] = int32(l)
	}
	x := img.Float32s(make([]float32, 0, img.Len()))
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("%s: %w: value %d of sample %d is %v", imgPath, ErrBadIDX, i%(len(x)/n), i/(len(x)/n), v)
		}
	}
	s := &Set{X: x, Y: y, Dim: len(x) / n}
	switch len(sample) {
	case 0, 1:
		// InputShape falls back to [Dim].
	case 2:
		s.Shape = [3]int{sample[0], sample[1], 1}
	case 3:
		s.Shape = [3]int{sample[0], sample[1], sample[2]}
	default:
		s.Dims = slices.Clone(sample)
	}
	return &idxSplit{set: s, sample: sample, labelPath: lblPath}, nil
}

// channelStats returns the mean and standard deviation of each of the
// channels interleaved in x (value j belongs to channel j mod channels).
// A constant channel gets deviation 1, so standardising only centres it.
func channelStats(x []float32, channels int) (mean, std []float32) {
	sum, sq, cnt := make([]float64, channels), make([]float64, channels), make([]float64, channels)
	for j, v := range x {
		c := j % channels
		sum[c] += float64(v)
		cnt[c]++
	}
	for c := range sum {
		sum[c] /= max(cnt[c], 1)
	}
	for j, v := range x {
		c := j % channels
		d := float64(v) - sum[c]
		sq[c] += d * d
	}
	mean, std = make([]float32, channels), make([]float32, channels)
	for c := range sum {
		mean[c] = float32(sum[c])
		std[c] = float32(math.Sqrt(sq[c] / max(cnt[c], 1)))
		if !(std[c] > 0) || math.IsInf(float64(std[c]), 0) {
			std[c] = 1
		}
	}
	return mean, std
}

// standardise maps every value v of channel c in x to (v − mean[c]) / std[c].
func standardise(x, mean, std []float32) {
	channels := len(mean)
	for j := range x {
		c := j % channels
		x[j] = (x[j] - mean[c]) / std[c]
	}
}
