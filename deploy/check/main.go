// Command check decodes every Kubernetes manifest it is given strictly
// against the API's own types (k8s.io/api, and the prometheus-operator's
// for the ServiceMonitor): an unknown or misspelt field, a wrong type or
// an unknown kind fails. With -podman DIR it also prints the `podman run`
// arguments the DaemonSet's pod template means on one node (one JSON
// array), its ConfigMap volumes written into DIR.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// The kinds the deployment uses, each with its type.
func object(apiVersion, kind string) (any, bool) {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}, true
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, true
	case "v1 Service":
		return &corev1.Service{}, true
	case "rbac.authorization.k8s.io/v1 Role":
		return &rbacv1.Role{}, true
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return &rbacv1.RoleBinding{}, true
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		return &rbacv1.ClusterRole{}, true
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}, true
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, true
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, true
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, true
	}
	return nil, false
}

// documents splits a YAML stream into its documents.
func documents(text string) []string {
	var out []string
	for _, d := range strings.Split("\n"+text, "\n---") {
		if strings.TrimSpace(stripComments(d)) != "" {
			out = append(out, d)
		}
	}
	return out
}

func stripComments(d string) string {
	var b strings.Builder
	for _, l := range strings.Split(d, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// decode decodes one document strictly; its object.
func decode(doc string) (any, error) {
	j, err := yaml.YAMLToJSONStrict([]byte(doc))
	if err != nil {
		return nil, err
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(j, &head); err != nil {
		return nil, err
	}
	o, ok := object(head.APIVersion, head.Kind)
	if !ok {
		return nil, fmt.Errorf("unknown kind %q of %q", head.Kind, head.APIVersion)
	}
	// As the API server decodes: field names matched exactly (not
	// regardless of case, as encoding/json does), unknown and duplicate
	// fields refused.
	strict, err := kjson.UnmarshalStrict(j, o, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", head.Kind, err)
	}
	if len(strict) > 0 {
		return nil, fmt.Errorf("%s: %v", head.Kind, strict)
	}
	return o, nil
}

// podman is the `podman run` a DaemonSet's pod template means on one
// node: the host's pid namespace, privileged, a read-only root, its CPU
// and memory limits, its volumes (host paths as they are; ConfigMaps
// written into dir) and environment, its command.
func podman(ds *appsv1.DaemonSet, maps map[string]*corev1.ConfigMap, dir string) ([]string, error) {
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		return nil, fmt.Errorf("the pod template has %d containers; one is translated", len(spec.Containers))
	}
	c := spec.Containers[0]
	args := []string{"run", "--rm", "--name", ds.Name}
	if spec.HostPID {
		args = append(args, "--pid=host")
	}
	if c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
		args = append(args, "--privileged")
	}
	if c.SecurityContext != nil && c.SecurityContext.ReadOnlyRootFilesystem != nil && *c.SecurityContext.ReadOnlyRootFilesystem {
		// As a kubelet runs it: no tmpfs of podman's own over /tmp or /run.
		args = append(args, "--read-only", "--read-only-tmpfs=false")
	}
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		args = append(args, "--memory", fmt.Sprint(q.Value()))
	}
	if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		args = append(args, "--cpus", fmt.Sprintf("%.3f", float64(q.MilliValue())/1000))
	}
	if spec.TerminationGracePeriodSeconds != nil {
		args = append(args, "--stop-timeout", fmt.Sprint(*spec.TerminationGracePeriodSeconds))
	}
	source := map[string]string{}
	for _, v := range spec.Volumes {
		switch {
		case v.HostPath != nil:
			if v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathDirectoryOrCreate {
				if err := os.MkdirAll(v.HostPath.Path, 0o755); err != nil {
					return nil, err
				}
			}
			source[v.Name] = v.HostPath.Path
		case v.ConfigMap != nil:
			m, ok := maps[v.ConfigMap.Name]
			if !ok {
				return nil, fmt.Errorf("volume %s: no ConfigMap %s", v.Name, v.ConfigMap.Name)
			}
			at := filepath.Join(dir, v.Name)
			if err := os.MkdirAll(at, 0o755); err != nil {
				return nil, err
			}
			for k, text := range m.Data {
				if err := os.WriteFile(filepath.Join(at, k), []byte(text), 0o644); err != nil {
					return nil, err
				}
			}
			source[v.Name] = at
		default:
			return nil, fmt.Errorf("volume %s: only hostPath and configMap are translated", v.Name)
		}
	}
	for _, m := range c.VolumeMounts {
		s, ok := source[m.Name]
		if !ok {
			return nil, fmt.Errorf("mount %s: no volume of that name", m.Name)
		}
		v := s + ":" + m.MountPath
		if m.ReadOnly {
			v += ":ro"
		}
		args = append(args, "-v", v)
	}
	for _, e := range c.Env {
		args = append(args, "-e", e.Name+"="+e.Value)
	}
	for _, p := range c.Ports {
		args = append(args, "--expose", fmt.Sprint(p.ContainerPort))
	}
	args = append(args, c.Image)
	args = append(args, c.Command...)
	args = append(args, c.Args...)
	return args, nil
}

func main() {
	dir := flag.String("podman", "", "print the DaemonSet as `podman run` arguments, its ConfigMaps written into this directory")
	flag.Parse()
	var ds *appsv1.DaemonSet
	maps := map[string]*corev1.ConfigMap{}
	n := 0
	for _, f := range flag.Args() {
		text, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for i, doc := range documents(string(text)) {
			o, err := decode(doc)
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s, document %d: %v\n", f, i+1, err)
				os.Exit(1)
			}
			n++
			switch v := o.(type) {
			case *appsv1.DaemonSet:
				ds = v
			case *corev1.ConfigMap:
				maps[v.Name] = v
			}
		}
	}
	if *dir == "" {
		fmt.Printf("%d objects decoded strictly\n", n)
		return
	}
	if ds == nil {
		fmt.Fprintln(os.Stderr, "no DaemonSet given")
		os.Exit(1)
	}
	args, err := podman(ds, maps, *dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, _ := json.Marshal(args)
	fmt.Println(string(out))
}
