# Sourced by the binding's GPU scripts (torch_binding.sh, dist_binding.sh) on the GPU machine
# (CUDA, PyTorch; no Rust), from the repository root: installs .dev/distflash-*.whl
# (build_wheel.sh) into its own folder beside the machine's torch and puts it on PYTHONPATH,
# and lets cudarc find an NVRTC.
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache} PYTHONUNBUFFERED=1
python3 -m pip install --quiet --disable-pip-version-check --no-deps --target /tmp/distflash-py .dev/distflash-*.whl
export PYTHONPATH=/tmp/distflash-py${PYTHONPATH:+:$PYTHONPATH}
# The kernels compile with NVRTC at run time (cudarc loads libnvrtc by name): the machine's own
# first, torch's pip-installed copy (nvidia/*/lib) after it.
TORCH_NVRTC=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d + "/**/libnvrtc.so*", recursive=True)})))' 2>/dev/null || true)
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$TORCH_NVRTC
