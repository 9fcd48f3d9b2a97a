print('Now run this command:')
print()
print('echo', 33 * 19, '> answer.txt')
