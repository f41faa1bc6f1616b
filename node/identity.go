package node

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
)

// LoadOrCreateIdentity returns the Ed25519 key stored at path, creating it
// (mode 0600, parent directories 0700) if the file does not exist. A key
// file that its group or others can access is refused with
// ErrKeyPermissions, as ssh refuses a private key.
func LoadOrCreateIdentity(path string) (crypto.PrivKey, error) {
	sk, err := LoadIdentity(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return sk, err
	}
	sk, _, err = crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, err
	}
	b, err := crypto.MarshalPrivateKey(sk)
	if err != nil {
		return nil, err
	}
	if err := writeKeyFile(path, b); err != nil {
		// Another process may have created it first: use theirs.
		if errors.Is(err, fs.ErrExist) {
			return LoadIdentity(path)
		}
		return nil, err
	}
	return sk, nil
}

// LoadIdentity reads the Ed25519 key stored at path (libp2p's protobuf
// private-key encoding, as written by LoadOrCreateIdentity).
func LoadIdentity(path string) (crypto.PrivKey, error) {
	b, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	sk, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadKey, path, err)
	}
	if sk.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("%w: %s: key type %v, want Ed25519", ErrBadKey, path, sk.Type())
	}
	return sk, nil
}

// PeerIDFromKeyFile returns the peer ID of the identity at path.
func PeerIDFromKeyFile(path string) (peer.ID, error) {
	sk, err := LoadIdentity(path)
	if err != nil {
		return "", err
	}
	return peer.IDFromPrivateKey(sk)
}

// GeneratePSK returns a fresh random 32-byte swarm key.
func GeneratePSK() ([]byte, error) {
	k := make([]byte, 32)
	_, err := rand.Read(k)
	return k, err
}

// EncodePSK returns psk in the swarm.key v1 format that IPFS and kubo use:
//
//	/key/swarm/psk/1.0.0/
//	/base16/
//	<64 hex digits>
func EncodePSK(psk []byte) []byte {
	return fmt.Appendf(nil, "/key/swarm/psk/1.0.0/\n/base16/\n%s\n", hex.EncodeToString(psk))
}

// WritePSK writes psk to path in the swarm.key format with mode 0600. It
// refuses to overwrite an existing file.
func WritePSK(path string, psk []byte) error {
	if len(psk) != 32 {
		return fmt.Errorf("%w: %d bytes, want 32", ErrBadPSK, len(psk))
	}
	return writeKeyFile(path, EncodePSK(psk))
}

// LoadPSK reads a swarm.key file. Like an identity key, it must not be
// accessible by group or others.
func LoadPSK(path string) ([]byte, error) {
	b, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	psk, err := pnet.DecodeV1PSK(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadPSK, path, err)
	}
	return psk, nil
}

func readKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %v", ErrKeyPermissions, path, st.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("%w: %s is larger than a key file", ErrBadKey, path)
	}
	return b, nil
}

// maxKeyFile bounds what we read from a key file (an Ed25519 key is 68
// bytes, a swarm key about 90).
const maxKeyFile = 4096

func writeKeyFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}
