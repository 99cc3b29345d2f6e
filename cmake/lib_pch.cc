// troupe_lib_pch: the target that precompiles the headers troupe's libraries
// parse (CMakeLists.txt); every static library of troupe's reuses its PCH.
// It defines nothing.
