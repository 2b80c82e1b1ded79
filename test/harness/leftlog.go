package harness

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
)

// leftToCAPM3Log matches the webhook's log line for a claim it left to CAPM3 after the answer.
var leftToCAPM3Log = regexp.MustCompile(`"IP claim left to CAPM3".* admission="([^"]*)" (IPClaim|IPAddressClaim)="([^"/]+)/([^"]+)"`)

// ClaimsLeftToCAPM3InLogs lists, as admission/namespace/kind/name, the claims the webhook
// processes whose logs are in dir (*.log) said they left to CAPM3: the admission is the token the
// stored Metal3Data records, so that a claim of the same name left to CAPM3 by another admission
// excuses nothing. The log is the record that survives API faults: the PreallocationIncomplete
// Event is best effort and the API server may refuse it.
func ClaimsLeftToCAPM3InLogs(dir string) (map[string]bool, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return nil, err
	}
	left := map[string]bool{}
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		scanner := bufio.NewScanner(f)
		scanner.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
		for scanner.Scan() {
			if m := leftToCAPM3Log.FindSubmatch(scanner.Bytes()); m != nil {
				left[string(m[1])+"/"+string(m[3])+"/"+string(m[2])+"/"+string(m[4])] = true
			}
		}
		err = scanner.Err()
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return left, nil
}
