#!/bin/bash
# Builds SEAL's FM-index (facebookresearch/SEAL @ fdaf307: seal/index.py + seal/cpp_modules, verbatim) as the
# wheel `seal_fm_index`, against sdsl-lite @ c32874c (SEAL's pinned submodule) and libdivsufsort @ 0f24acd
# (sdsl-lite's pinned submodule). Needs g++, cmake, and `pip install swig` (4.5.1 used). Sources: git clones, or
# bare snapshots (SEAL_GIT, SDSL_GIT, DIVSUFSORT_GIT point at git dirs).
# Usage: SEAL_GIT=<SEAL git dir> SDSL_GIT=<sdsl-lite git dir> DIVSUFSORT_GIT=<libdivsufsort git dir> bash tools/build_seal_fm_index.sh
# then tests/index/test_substring_fm_parity.py also compares with SEAL's own index (its counts are read from
# SEAL's backward-search step from the full range: its get_range starts one past the end and can over-count).
set -euo pipefail
W=$(realpath -m "${W:-build/seal_fm_index}"); SEAL_GIT=${SEAL_GIT:?}; SDSL_GIT=${SDSL_GIT:?}; DIVSUFSORT_GIT=${DIVSUFSORT_GIT:?}
mkdir -p $W && cd $W && rm -rf sdsl-lite SEAL pkg prefix && mkdir -p sdsl-lite SEAL
git -C $SDSL_GIT archive c32874cb2d8524119f25f3b501526fe692df29f4 | tar -x -C sdsl-lite
rm -rf sdsl-lite/external/libdivsufsort && mkdir sdsl-lite/external/libdivsufsort
git -C $DIVSUFSORT_GIT archive 0f24acd8de208464769c782119dacf158647f7ed | tar -x -C sdsl-lite/external/libdivsufsort
git -C $SEAL_GIT archive fdaf307 | tar -x -C SEAL
# sdsl-lite: no googletest (its tests are not built)
python - <<'PY'
p='sdsl-lite/external/CMakeLists.txt'; s=open(p).read(); open(p,'w').write(s[:s.index('## Add gtest')])
p='sdsl-lite/CMakeLists.txt'; s=open(p).read(); open(p,'w').write(s.replace('add_subdirectory(test)','#add_subdirectory(test)'))
PY
mkdir -p sdsl-lite/b && (cd sdsl-lite/b && cmake -DCMAKE_INSTALL_PREFIX=$W/prefix -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
  -DCMAKE_BUILD_TYPE=Release .. && make -j4 sdsl && make install)
(cd SEAL/seal/cpp_modules && swig -c++ -python -o fm_index_wrap.cpp fm_index.i)   # what SEAL's setup.py runs through distutils
mkdir -p pkg/seal_fm_index/cpp_modules
cp SEAL/seal/index.py SEAL/LICENSE pkg/seal_fm_index/
cp SEAL/seal/cpp_modules/{__init__.py,fm_index.cpp,fm_index.hpp,fm_index.py,fm_index_wrap.cpp} pkg/seal_fm_index/cpp_modules/
echo 'from .index import FMIndex, load_FMIndex  # noqa: F401  (SEAL seal/index.py, without the rest of SEAL)' \
  > pkg/seal_fm_index/__init__.py
cat > pkg/setup.py <<PY
from setuptools import setup, Extension
setup(name="seal-fm-index", version="1.0+fdaf307", packages=["seal_fm_index", "seal_fm_index.cpp_modules"],
      ext_modules=[Extension("seal_fm_index.cpp_modules._fm_index",
          sources=["seal_fm_index/cpp_modules/fm_index.cpp", "seal_fm_index/cpp_modules/fm_index_wrap.cpp"],
          include_dirs=["seal_fm_index/cpp_modules", "$W/prefix/include"], library_dirs=["$W/prefix/lib"],
          libraries=["sdsl", "divsufsort", "divsufsort64"], language="c++",
          extra_compile_args=["-std=c++11", "-DNDEBUG", "-O3"])])
PY
(cd pkg && pip wheel --no-build-isolation --no-deps -w $W/dist .)
echo "pip install $W/dist/seal_fm_index-*.whl"
