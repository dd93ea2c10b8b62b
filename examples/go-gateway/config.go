package main

import "os"

func env(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func registryURL() string {
	return env("RATCHET_SCHEMA_REGISTRY_URL", "http://127.0.0.1:8081/apis/ccompat/v7")
}
