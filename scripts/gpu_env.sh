# Sourced by the scripts for GPU machines without network (gpu_run.sh, gpu_bench.sh), with `repo`
# (the checkout) and `out` (where pip's log goes) set: installs WHEELS/*.whl once into SITE
# (default /tmp/fp4repro-site; scripts/prepare_gpu_wheels.sh makes them), puts SITE and the
# checkout's src/ first on PYTHONPATH, defines `fp4repro` as the CLI of this checkout and `commit`
# as the commit it measures (FP4REPRO_SOURCE_COMMIT where the copy has no .git).
site="${SITE:-/tmp/fp4repro-site}"
if [ -n "${WHEELS:-}" ] && [ ! -f "$site/.installed" ]; then
    python -m pip install --quiet --no-deps --target "$site" "$WHEELS"/*.whl > "$out/pip.log" 2>&1 \
        || { echo "installing $WHEELS/*.whl failed: see $out/pip.log" >&2; exit 1; }
    touch "$site/.installed"
fi
export PYTHONPATH="${WHEELS:+$site:}$repo/src${PYTHONPATH:+:$PYTHONPATH}"
fp4repro() { python -c 'import sys; from fp4repro.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
commit="${FP4REPRO_SOURCE_COMMIT:-$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
