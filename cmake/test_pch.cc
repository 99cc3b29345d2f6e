// troupe_test_pch: the target that precompiles the headers every test
// parses (CMakeLists.txt); the tests reuse its PCH. It runs nothing.
int main() { return 0; }
