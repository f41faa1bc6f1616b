# A static peer binary on a distroless base. MNIST (the GoMNIST module's
# IDX files) is copied in at the module-cache path peer looks in, so
# `docker run IMAGE demo` and `run` work with no --data; mount a folder and
# pass --data for other datasets (charlm needs --data: the image has no Go
# sources). Build: docker build -t starling .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /peer ./cmd/peer

FROM gcr.io/distroless/static-debian12
COPY --from=build /peer /usr/local/bin/peer
COPY --from=build /go/pkg/mod/github.com/petar /go/pkg/mod/github.com/petar
ENV GOMODCACHE=/go/pkg/mod
# libp2p's default port; peer run --listen changes it.
EXPOSE 4001/tcp 4001/udp
ENTRYPOINT ["/usr/local/bin/peer"]
CMD ["-h"]
