# Installs pagewise like a system tool:
#
#   make install PREFIX=/usr/local     # (DESTDIR=... to stage)
#   make deb                           # target/deb/pagewise_VERSION_ARCH.deb
#   make uninstall PREFIX=/usr/local
#   make image                         # localhost/pagewise:VERSION, the node agent's image
#   make deploy-check                  # the Kubernetes manifests and chart, checked
#
# What goes where (PREFIX/...):
#   bin/pagewise, bin/pagewise-bench       the tool and its benchmarks
#   lib/pagewise/libpagewise_preload.so    the preload shim (found from bin/)
#   lib/libpagewise.so.VERSION, .so.MAJOR, .so and include/pagewise.h
#     (the installed copy gets its soname, libpagewise.so.MAJOR, from
#     patchelf: the build tree's copy has none, so programs built against
#     target/release keep finding it there)
#   lib/pkgconfig/pagewise.pc              pkg-config --cflags --libs pagewise
#   share/man/man1/pagewise*.1             a man page per command
#   share/bash-completion, zsh, fish       shell completions
#   share/doc/pagewise                     README and licences

PREFIX  ?= /usr/local
DESTDIR ?=
CARGO   ?= cargo
# Where the built files are (install-files installs what is there).
TARGET  ?= target/release

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
MAJOR   := $(firstword $(subst ., ,$(VERSION)))
ARCH    := $(shell dpkg --print-architecture 2>/dev/null || uname -m)

ROOT    := $(DESTDIR)$(PREFIX)
BIN     := $(ROOT)/bin
LIB     := $(ROOT)/lib
SHARE   := $(ROOT)/share

.PHONY: all build bench bench-check check install install-files uninstall deb image helm deploy-check

all: build

# The product, then the experiments (a workspace of their own,
# experiments/, built into the same target directory: pagewise-bench lands
# beside pagewise and the library is built once for both).
EXPERIMENTS := --manifest-path experiments/Cargo.toml --target-dir $(CURDIR)/target

build:
	$(CARGO) build --release --locked --workspace
	$(CARGO) build --release --locked $(EXPERIMENTS)

bench:
	$(CARGO) build --release --locked $(EXPERIMENTS)

# Before each commit, in minutes from a warm target directory: the format,
# the commit messages, the lints, the library's shape, the unit tests and
# the integration tests that take seconds. CI (.ci/run) runs all of them
# and the rest (the far-memory programs, rollbacks of thread pools,
# containers, the package, the image, the benchmarks' smoke runs).
FAST_TESTS := track farmem inject thp stop settings inspect dedup \
	shim_contract json_schema header mirrors corpus bpf_differential \
	special_mappings cow_sharing conventions c_programs farmem_trust \
	bench_forward snapshot_cli inspect_cli rollback_cli criu_cli

check:
	$(CARGO) fmt --all --check
	$(CARGO) fmt --manifest-path experiments/Cargo.toml --all --check
	scripts/check-commits
	$(CARGO) clippy --workspace --all-targets --release --locked -- -D warnings
	$(CARGO) clippy $(EXPERIMENTS) --all-targets --release --locked -- -D warnings
	scripts/check-layers --quiet
	scripts/check-unsafe
	$(CARGO) build --release --locked --workspace
	$(CARGO) test --release --locked --workspace --lib --bins $(addprefix --test ,$(FAST_TESTS))

# The experiments' format, lints and unit tests.
bench-check:
	$(CARGO) fmt --manifest-path experiments/Cargo.toml --all --check
	$(CARGO) clippy --release --locked $(EXPERIMENTS) --all-targets -- -D warnings
	$(CARGO) test --release --locked $(EXPERIMENTS)

install: build install-files

install-files:
	install -d $(BIN) $(LIB)/pagewise $(LIB)/pkgconfig $(ROOT)/include \
		$(SHARE)/man/man1 $(SHARE)/doc/pagewise \
		$(SHARE)/bash-completion/completions $(SHARE)/zsh/vendor-completions \
		$(SHARE)/fish/vendor_completions.d
	install -m 755 $(TARGET)/pagewise $(TARGET)/pagewise-bench $(BIN)/
	install -m 644 $(TARGET)/libpagewise_preload.so $(LIB)/pagewise/
	install -m 755 $(TARGET)/libpagewise.so $(LIB)/libpagewise.so.$(VERSION)
	patchelf --set-soname libpagewise.so.$(MAJOR) $(LIB)/libpagewise.so.$(VERSION)
	ln -sf libpagewise.so.$(VERSION) $(LIB)/libpagewise.so.$(MAJOR)
	ln -sf libpagewise.so.$(MAJOR) $(LIB)/libpagewise.so
	install -m 644 include/pagewise.h $(ROOT)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' scripts/pagewise.pc.in \
		> $(LIB)/pkgconfig/pagewise.pc
	$(TARGET)/pagewise -q generate man $(SHARE)/man/man1
	gzip -9nf $(SHARE)/man/man1/pagewise*.1
	$(TARGET)/pagewise -q generate completions bash $(SHARE)/bash-completion/completions
	mv -f $(SHARE)/bash-completion/completions/pagewise.bash $(SHARE)/bash-completion/completions/pagewise
	$(TARGET)/pagewise -q generate completions zsh $(SHARE)/zsh/vendor-completions
	$(TARGET)/pagewise -q generate completions fish $(SHARE)/fish/vendor_completions.d
	install -m 644 README.md LICENSE-MIT LICENSE-APACHE $(SHARE)/doc/pagewise/

uninstall:
	rm -f $(BIN)/pagewise $(BIN)/pagewise-bench
	rm -rf $(LIB)/pagewise $(SHARE)/doc/pagewise
	rm -f $(LIB)/libpagewise.so $(LIB)/libpagewise.so.$(MAJOR) $(LIB)/libpagewise.so.$(VERSION)
	rm -f $(ROOT)/include/pagewise.h $(LIB)/pkgconfig/pagewise.pc
	rm -f $(SHARE)/man/man1/pagewise*.1.gz
	rm -f $(SHARE)/bash-completion/completions/pagewise
	rm -f $(SHARE)/zsh/vendor-completions/_pagewise $(SHARE)/fish/vendor_completions.d/pagewise.fish

# A Debian package of what `install` puts under /usr.
DEB := target/deb/pagewise_$(VERSION)_$(ARCH).deb
deb: build
	rm -rf target/deb/root
	$(MAKE) install-files PREFIX=/usr DESTDIR=$(CURDIR)/target/deb/root
	install -d target/deb/root/DEBIAN
	sed -e 's|@VERSION@|$(VERSION)|' -e 's|@ARCH@|$(ARCH)|' \
		-e "s|@SIZE@|$$(du -sk target/deb/root/usr | cut -f1)|" \
		scripts/deb/control.in > target/deb/root/DEBIAN/control
	install -m 755 scripts/deb/postinst scripts/deb/postrm target/deb/root/DEBIAN/
	# zstd at level 9: 1.5 s here against xz's 35 s (44 MB against 36 MB);
	# dpkg reads it from 1.21.18 on (Debian 12).
	dpkg-deb --root-owner-group -Zzstd -z9 --build target/deb/root $(DEB)
	@echo "built $(DEB)"

# The node agent's image, from the package above on a Debian base made
# with debootstrap (cached in IMAGE_CACHE, outside the clone); no registry
# is pulled from.
IMAGE_CACHE ?= $(HOME)/.cache/pagewise
IMAGE := localhost/pagewise:$(VERSION)
image: deb
	scripts/image $(DEB) $(IMAGE) $(IMAGE_CACHE)

# Helm, built from the Go module proxy into IMAGE_CACHE/bin (once).
HELM_VERSION := v3.22.0
helm:
	test -x $(IMAGE_CACHE)/bin/helm || GOBIN=$(IMAGE_CACHE)/bin go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

# The manifests and the chart decoded strictly against the Kubernetes API's
# types, and the DaemonSet run under podman (scripts/check-deploy).
deploy-check: build
	PATH="$(IMAGE_CACHE)/bin:$$PATH" scripts/check-deploy
