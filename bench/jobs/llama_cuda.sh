# Sourced by device jobs: starts the build of llama.cpp's llama-bench and llama-quantize (CUDA, sm_90,
# GGML_NATIVE, static) from ./llama.tar.xz (the peer tarball copied into the device root) under $W/llama-cuda,
# in the background, unless $W/llama-cuda/bin/llama-bench is there already (a warm machine). Needs W and O
# (the job's work and log folders); sets L (the bin folder) and build_pid (empty when nothing was started;
# `wait $build_pid` before using $L). The build log is $O/llama-cuda.log (about 200 s at -j 13 on the device).
mkdir -p "$W/llama-src"; L=$W/llama-cuda/bin; build_pid=
if [[ ! -x $L/llama-bench ]]; then
  tar -C "$W/llama-src" -xJf llama.tar.xz
  flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
         -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON)
  ( cmake -S "$W/llama-src" -B "$W/llama-cuda" "${flags[@]}" -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_ARCHITECTURES=90 &&
    nice -n 5 cmake --build "$W/llama-cuda" -j 13 --target llama-quantize llama-bench ) >"$O/llama-cuda.log" 2>&1 &
  build_pid=$!
fi
