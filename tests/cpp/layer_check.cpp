// The program of a layer check (CMakeLists.txt): it does nothing, but it links one layer's every
// object with only the layers below it, so that a call into a higher layer fails the build.
int main() { return 0; }
